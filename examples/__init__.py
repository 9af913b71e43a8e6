"""simjax examples: runnable scripts (see README), and helpers they share."""


def light_options(model):
    """``model`` with semi-implicit Euler and the constraint solver disabled.

    The short modes of the examples use it: those programs compile several times faster
    than RK4 with the constraint solver, and their cart-poles stay well inside the slider
    limit the solver would enforce.
    """
    from simjax.types import DisableBit, IntegratorType
    opt = model.opt
    return model.replace(opt=opt.replace(
        integrator=int(IntegratorType.EULER),
        disableflags=opt.disableflags | int(DisableBit.CONSTRAINT)))
