"""placeholder"""
PLUGINS = []
