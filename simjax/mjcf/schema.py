"""MJCF grammar of MuJoCo 4.0: elements, their attributes (type, arity, built-in default) and
children, plus the default-class rules. Pure data; :mod:`simjax.mjcf.parse` interprets it.

The tables are written in a compact text notation (parsed once at import) so that one
element fits on a few lines:

``internal <tag>: attr attr ...`` declares an element (``<tag>`` only when the XML tag
differs from the internal name, e.g. ``spatial_site <site>``). Each attribute token is
``name[:type][=default][!flags]``:

* type: ``real``/``int`` (one value), ``real[n]`` (exactly n), ``real[a..b]`` (a to b values;
  missing trailing ones keep the previous value), ``real[]`` (any number), ``bool``,
  ``tfa`` (false/true/auto, kept as a string), ``kw.ENUM`` (one keyword), ``flags.ENUM``
  (several keywords, kept as the string); no type = plain string.
* default: comma separated; ``-`` = undefined (None). Without ``=``: zeros for numbers,
  false for bool, 'auto' for tfa, the first keyword for kw, None for strings and ``[]``.
* flags: ``!r`` required, ``!n`` not settable in a ``<default>`` class.
* ``$group`` splices a group declared as ``$group: ...``.

A following ``> ...`` line lists children as ``tag[=internal]CARD`` with CARD one of
``*`` (any number), ``?`` (at most one) or ``R`` (recursive, any number).
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

ENUMS: dict[str, tuple[str, ...]] = {
    "coordinate": ("local", "global"),
    "angle": ("radian", "degree"),
    "fluidshape": ("none", "ellipsoid"),
    "enable": ("disable", "enable"),
    "tfa": ("false", "true", "auto"),
    "FalseAuto": ("false", "auto"),
    "bodysleep": ("auto", "never", "allowed", "init"),
    "jointtype": ("free", "ball", "slide", "hinge"),
    "geomtype": ("plane", "hfield", "sphere", "capsule", "ellipsoid", "cylinder", "box", "mesh",
                 "sdf"),
    "sitetype": ("sphere", "capsule", "ellipsoid", "cylinder", "box", "mesh"),
    "projection": ("perspective", "orthographic"),
    "camlight": ("fixed", "track", "trackcom", "targetbody", "targetbodycom"),
    "lighttype": ("spot", "directional", "point", "image"),
    "integrator": ("Euler", "RK4", "implicit", "implicitfast", "discrete"),
    "cone": ("pyramidal", "elliptic"),
    "jacobian": ("dense", "sparse", "auto"),
    "solver": ("PGS", "CG", "Newton"),
    "texture": ("2d", "cube", "skybox"),
    "colorspace": ("auto", "linear", "sRGB"),
    "builtin": ("none", "gradient", "checker", "flat"),
    "mark": ("none", "edge", "cross", "random"),
    "dyn": ("none", "integrator", "filter", "filterexact", "muscle", "dcmotor", "pid", "user"),
    "gain": ("fixed", "affine", "muscle", "dcmotor", "so3", "pid", "user"),
    "bias": ("none", "affine", "muscle", "dcmotor", "so3", "user"),
    "inputchart": ("expmap", "quat"),
    "inputbit": ("pos", "vel", "ff", "voltage", "none"),
    "interp": ("zoh", "linear", "cubic"),
    "stage": ("none", "pos", "vel", "acc"),
    "datatype": ("real", "positive", "axis", "quaternion"),
    "frameobj": ("body", "xbody", "geom", "site", "camera"),
    "condata": ("found", "force", "torque", "dist", "pos", "normal", "tangent", "linvel",
                "angvel"),
    "raydata": ("dist", "dir", "origin", "point", "normal", "depth"),
    "camout": ("rgb", "depth", "distance", "normal", "segmentation"),
    "reduce": ("none", "mindist", "maxforce", "netforce"),
    "conflict": ("warning", "merge", "error"),
    "passthrough": ("none", "textures"),
    "lrmode": ("none", "muscle", "muscleuser", "all"),
    "meshinertia": ("convex", "legacy", "exact", "shell"),
    "meshbuiltin": ("none", "sphere", "hemisphere", "cone", "supertorus", "supersphere", "wedge",
                    "plate"),
    "fcomp": ("grid", "box", "cylinder", "ellipsoid", "square", "disc", "circle", "mesh", "gmsh",
              "direct"),
    "fdof": ("full", "radial", "trilinear", "quadratic", "2d"),
    "flexself": ("none", "narrow", "bvh", "sap", "auto"),
    "elastic2d": ("none", "bend", "stretch", "both"),
    "section": ("circle", "box"),
    "flexeq": ("false", "true", "vert", "strain"),
    "scaling": ("similar", "geometry"),
    "texrole": ("rgb", "occlusion", "roughness", "metallic", "normal", "opacity", "emissive",
                "rgba", "orm"),
}

# Groups shared by several elements (spliced with $name).
_GROUPS = """
$ori: quat:real[4]=- axisangle:real[4]=- xyaxes:real[6]=- zaxis:real[3]=- euler:real[3]=-
$act_base: name class group:int nsample:int interp:kw.interp delay:real ctrlrange:real[2]
    user:real[]
$act_dyn: lengthrange:real[2]!n gear:real[1..6]=1,0,0,0,0,0 damping:real[1..3] armature:real
    cranklength:real
$trn: joint!n jointinparent!n tendon!n slidersite!n cranksite!n site!n refsite!n
$sens: name nsample:int interp:kw.interp delay:real interval:real[1..2] cutoff:real noise:real
    user:real[]
$frameobj: objtype:kw.frameobj=-!r objname!r
$frameref: reftype:kw.frameobj=- refname
$eq: name class active:bool=true solref:real[1..2]=0.02,1 solimp:real[1..5]=0.9,0.95,0.001,0.5,2
$solfl: solreflimit:real[1..2]=0.02,1 solimplimit:real[1..5]=0.9,0.95,0.001,0.5,2
    solreffriction:real[1..2]=0.02,1 solimpfriction:real[1..5]=0.9,0.95,0.001,0.5,2
$tendon: name class group:int limited:tfa actuatorfrclimited:tfa range:real[2]
    actuatorfrcrange:real[2] $solfl frictionloss:real springlength:real[1..2]=-1,-1
    springyield:real
$bodykids: bodyR frameR replicate* inertial? joint* freejoint* geom* attach* site* camera*
    light* plugin* composite* flexcomp*
"""

_ELEMENTS = """
mujoco: model
   > compiler* option* size* statistic* visual* defaultR extension* asset* worldbody* deformable*
     contact* tendon* equality* actuator* sensor* custom* keyframe*
compiler: autolimits:bool=true boundmass:real boundinertia:real settotalmass:real=-1
    balanceinertia:bool strippath:bool coordinate:kw.coordinate angle:kw.angle=degree
    fitaabb:bool eulerseq=xyz meshdir texturedir discardvisual:bool usethread:bool=true
    fusestatic:bool inertiafromgeom:tfa inertiagrouprange:int[2]=0,5 saveinertial:bool
    savecompiled:bool=true savecanonical:bool=true assetdir alignfree:bool
    conflict:kw.conflict passthrough:kw.passthrough
   > lengthrange?
lengthrange: mode:kw.lrmode=muscle useexisting:bool=true uselimit:bool accel:real=20 maxforce:real
    timeconst:real=1 timestep:real=0.01 inttotal:real=10 interval:real=2 tolrange:real=0.05
option: timestep:real=0.002 impratio:real=1 tolerance:real=1e-8 ls_tolerance:real=0.01
    noslip_tolerance:real=1e-6 ccd_tolerance:real=1e-6 sleep_tolerance:real=0.001
    gravity:real[3]=0,0,-9.81 wind:real[3] magnetic:real[3]=0,-0.5,0 density:real viscosity:real
    o_margin:real o_solref:real[1..2]=0.02,1 o_solimp:real[1..5]=0.9,0.95,0.001,0.5,2
    o_friction:real[1..5]=1,1,0.005,0.0001,0.0001 integrator:kw.integrator cone:kw.cone
    jacobian:kw.jacobian=auto solver:kw.solver=Newton iterations:int=100 ls_iterations:int=50
    noslip_iterations:int ccd_iterations:int=35 sdf_iterations:int=10 sdf_initpoints:int=40
    actuatorgroupdisable:int[]
   > flag?
flag: constraint:kw.enable=enable equality:kw.enable=enable frictionloss:kw.enable=enable
    limit:kw.enable=enable contact:kw.enable=enable spring:kw.enable=enable
    damper:kw.enable=enable gravity:kw.enable=enable clampctrl:kw.enable=enable
    warmstart:kw.enable=enable filterparent:kw.enable=enable actuation:kw.enable=enable
    refsafe:kw.enable=enable sensor:kw.enable=enable midphase:kw.enable=enable
    eulerdamp:kw.enable=enable autoreset:kw.enable=enable nativeccd:kw.enable=enable
    island:kw.enable=enable multiccd:kw.enable=enable override:kw.enable energy:kw.enable
    fwdinv:kw.enable invdiscrete:kw.enable sleep:kw.enable diagexact:kw.enable ipc:kw.enable
    speculative:kw.enable
size: memory njmax:int=-1 nconmax:int=-1 nstack:int=-1 nuserdata:int nkey:int nuser_body:int=-1
    nuser_jnt:int=-1 nuser_geom:int=-1 nuser_site:int=-1 nuser_cam:int=-1 nuser_tendon:int=-1
    nuser_actuator:int=-1 nuser_sensor:int=-1
statistic: meaninertia:real=- meanmass:real=- meansize:real=- extent:real=- center:real[3]=-
visual:
   > global? quality? headlight? map? scale? rgba?
global: cameraid:int=-1 orthographic:bool fovy:real=45 ipd:real=0.068 azimuth:real=90
    elevation:real=-45 linewidth:real=1 glow:real=0.3 offwidth:int=640 offheight:int=480
    realtime:real=1 ellipsoidinertia:bool bvactive:bool
quality: shadowsize:int=4096 offsamples:int=4 numslices:int=28 numstacks:int=16 numquads:int=4
headlight: ambient:real[3]=0.1,0.1,0.1 diffuse:real[3]=0.4,0.4,0.4 specular:real[3]=0.5,0.5,0.5
    active:tfa
map: stiffness:real=100 stiffnessrot:real=500 force:real=0.005 torque:real=0.1 alpha:real=0.3
    fogstart:real=3 fogend:real=10 znear:real=0.01 zfar:real=50 haze:real=0.3
    shadowclip:real=1 shadowscale:real=0.6 actuatortendon:real=2
scale: forcewidth:real=0.1 contactwidth:real=0.3 contactheight:real=0.1 connect:real=0.2
    com:real=0.4 camera:real=0.3 light:real=0.3 selectpoint:real=0.2 jointlength:real=1
    jointwidth:real=0.1 actuatorlength:real=0.7 actuatorwidth:real=0.2 framelength:real=1
    framewidth:real=0.1 constraint:real=0.1 slidercrank:real=0.2 frustum:real=10
rgba: fog:real[4]=0,0,0,1 haze:real[4]=1,1,1,1 force:real[4]=1,0.5,0.5,1
    inertia:real[4]=0.8,0.2,0.2,0.6 joint:real[4]=0.2,0.6,0.8,1 actuator:real[4]=0.2,0.25,0.2,1
    actuatornegative:real[4]=0.2,0.6,0.9,1 actuatorpositive:real[4]=0.9,0.4,0.2,1
    com:real[4]=0.9,0.9,0.9,1 camera:real[4]=0.6,0.9,0.6,1 light:real[4]=0.6,0.6,0.9,1
    selectpoint:real[4]=0.9,0.9,0.1,1 connect:real[4]=0.2,0.2,0.8,1
    contactpoint:real[4]=0.9,0.6,0.2,1 contactforce:real[4]=0.7,0.9,0.9,1
    contactfriction:real[4]=0.9,0.8,0.4,1 contacttorque:real[4]=0.9,0.7,0.9,1
    contactgap:real[4]=0.5,0.8,0.9,1 rangefinder:real[4]=1,1,0.1,1
    constraint:real[4]=0.9,0,0,1 slidercrank:real[4]=0.5,0.3,0.8,1
    crankbroken:real[4]=0.9,0,0,1 frustum:real[4]=1,1,0,0.2 bv:real[4]=0,1,0,0.5
    bvactive:real[4]=1,0,0,0.5
default: class
   > defaultR mesh? material? texture? joint? geom? site? camera? light? pair?
     equality=default_equality? tendon=default_tendon? general? motor? position? velocity?
     intvelocity? orientation? pid? damper? cylinder? muscle? adhesion? dcmotor?
extension:
   > plugin=extension_plugin*
extension_plugin <plugin>: plugin!r
   > instance*
instance: name!r
   > config*
config: key!r value!r
plugin: plugin instance
   > config*
asset:
   > mesh* hfield* skin* texture* material* model*
mesh: name class content_type!n file!n vertex:real[]!n normal:real[]!n texcoord:real[]!n
    face:int[]!n refpos:real[3]!n refquat:real[4]=1,0,0,0!n scale:real[3]=1,1,1
    smoothnormal:bool!n maxhullvert:int=-1 inertia:kw.meshinertia=legacy
    builtin:kw.meshbuiltin=none!n params:real[]!n material!n
   > plugin*
hfield: name content_type file nrow:int ncol:int size:real[4]=-!r elevation:real[]
skin: name file material rgba:real[4]=0.5,0.5,0.5,1 inflate:real vertex:real[] texcoord:real[]
    face:int[] group:int
   > bone*
bone: body!r bindpos:real[3]=-!r bindquat:real[4]=-!r vertid:int[]!r vertweight:real[]!r
texture: name class type:kw.texture=cube colorspace:kw.colorspace content_type!n file!n
    gridsize:int[2]=1,1 gridlayout fileright!n fileleft!n fileup!n filedown!n filefront!n
    fileback!n builtin:kw.builtin rgb1:real[3]=0.8,0.8,0.8 rgb2:real[3]=0.5,0.5,0.5
    mark:kw.mark markrgb:real[3] random:real=0.01 width:int height:int hflip:bool vflip:bool
    nchannel:int=3 embed:tfa
material: name class texture texrepeat:real[2]=1,1 texuniform:bool emission:real
    specular:real=0.5 shininess:real=0.5 reflectance:real metallic:real=-1 roughness:real=-1
    rgba:real[4]=1,1,1,1
   > layer*
layer: texture!r role:kw.texrole=-!r
model: name file content_type
worldbody:
   > body* frame* replicate* geom* attach* site* camera* light* plugin* composite* flexcomp*
body: name childclass pos:real[3] $ori mocap:bool gravcomp:real sleep:kw.bodysleep
    simple:kw.FalseAuto=auto fuse:kw.FalseAuto=auto user:real[]
   > $bodykids
frame: name childclass pos:real[3] $ori scale:real[1..3]=1,1,1 scaling:kw.scaling
    massscale:real
   > $bodykids
replicate: count:int=-!r offset:real[3] euler:real[3] sep childclass
   > $bodykids
inertial: pos:real[3]=-!r mass:real=-!r diaginertia:real[3]=- fullinertia:real[6]=- $ori
joint: name class type:kw.jointtype=hinge group:int pos:real[3] axis:real[3]=0,0,1
    springdamper:real[2]=- limited:tfa actuatorfrclimited:tfa $solfl stiffness:real[1..3]
    range:real[2] actuatorfrcrange:real[2] actuatorgravcomp:bool margin:real ref:real
    springref:real springyield:real armature:real damping:real[1..3] frictionloss:real
    user:real[]
freejoint: name group:int align:tfa
geom: name class type:kw.geomtype=sphere contype:int=1 conaffinity:int=1 condim:int=3 group:int
    priority:int size:real[1..3] material friction:real[1..3]=1,0.005,0.0001 mass:real=-
    density:real=1000 shellinertia:bool solmix:real=1 solref:real[1..2]=0.02,1
    solimp:real[1..5]=0.9,0.95,0.001,0.5,2 margin:real gap:real surfacevel:real[1..6]
    adhesion:real fromto:real[6]=- pos:real[3] $ori hfield mesh fitscale:real=1
    rgba:real[4]=0.5,0.5,0.5,1 castshadow:bool=true fluidshape:kw.fluidshape
    fluidcoef:real[1..5]=0.5,0.25,1.5,1,1 user:real[]
   > plugin*
attach: model body frame prefix!r
site: name class type:kw.sitetype group:int pos:real[3] $ori material mesh
    size:real[1..3]=0.005,0.005,0.005 fromto:real[6]=- rgba:real[4]=0.5,0.5,0.5,1 user:real[]
camera: name class projection:kw.projection fovy:real=45 ipd:real=0.068 resolution:int[2]=1,1
    output:flags.camout=rgb pos:real[3] $ori mode:kw.camlight target!n focal:real[2]=-
    focalpixel:real[2]=- principal:real[2]=- principalpixel:real[2]=- sensorsize:real[2]=-
    user:real[]
light: name class directional:bool type:kw.lighttype castshadow:bool=true active:bool=true
    pos:real[3] dir:real[3]=0,0,-1 bulbradius:real=0.02 intensity:real range:real=10
    attenuation:real[3]=1,0,0 cutoff:real=45 softness:real=0.2 exponent:real=10
    ambient:real[3] diffuse:real[3]=0.7,0.7,0.7 specular:real[3]=0.3,0.3,0.3
    mode:kw.camlight target!n texture!n
composite: prefix type!r count:int[1..3] offset:real[3] vertex:real[] initial curve
    size:real[1..3] quat:real[4]
flexcomp: name!r type:kw.fcomp group:int dim:int=2 dof:kw.fdof count:int[3]=10,10,10
    cellcount:int[3]=1,1,1 spacing:real[3]=0.02,0.02,0.02 radius:real=0.005 rigid:bool
    mass:real=1 inertiabox:real=0.005 scale:real[3]=1,1,1 file mesh point:real[] element:real[]
    texcoord:real[] material rgba:real[4]=0.5,0.5,0.5,1 flatskin:bool pos:real[3] $ori
    origin:real[3]
   > edge=flexcomp_edge? elasticity? contact=flex_contact? pin* plugin*
flexcomp_edge <edge>: equality:kw.flexeq solref:real[1..2]=0.02,1
    solimp:real[1..5]=0.9,0.95,0.001,0.5,2 stiffness:real damping:real
elasticity: young:real poisson:real shear:real damping:real thickness:real=-1 yield:real
    elastic2d:kw.elastic2d section:kw.section sectionsize:real[]
flex_contact <contact>: contype:int=1 conaffinity:int=1 condim:int=3 priority:int
    friction:real[1..3]=1,0.005,0.0001 solmix:real=1 solref:real[1..2]=0.02,1
    solimp:real[1..5]=0.9,0.95,0.001,0.5,2 margin:real gap:real selfcollide:kw.flexself=auto
    activelayers:int=1 passive:bool
pin: id:real[] range:real[] grid:real[] gridrange:real[]
deformable:
   > flex* skin*
flex: name group:int dim:int=2 radius:real=0.005 material rgba:real[4]=0.5,0.5,0.5,1
    flatskin:bool body!r vertex:real[] element:int[]!r texcoord:real[] elemtexcoord:int[] node
    nodecoord:real[] cellcount:int[3]=1,1,1 dof:kw.fdof
   > contact=flex_contact? edge=flex_edge? elasticity?
flex_edge <edge>: stiffness:real damping:real
contact:
   > pair* exclude*
pair: name class geom1!n geom2!n condim:int=3 friction:real[1..5]=1,1,0.005,0.0001,0.0001
    solref:real[1..2]=0.02,1 solreffriction:real[1..2] solimp:real[1..5]=0.9,0.95,0.001,0.5,2
    gap:real margin:real adhesion:real
exclude: name body1!r body2!r
equality:
   > connect* weld* joint=equality_joint* tendon=equality_tendon* flex=equality_flex*
     flexstrain*
connect: $eq body1 body2 anchor:real[3]=- site1 site2
weld: $eq body1 body2 relpose:real[7]=- anchor:real[3] site1 site2 torquescale:real=1
equality_joint <joint>: $eq joint1!r joint2 polycoef:real[1..5]=0,1,0,0,0
equality_tendon <tendon>: $eq tendon1!r tendon2 polycoef:real[1..5]=0,1,0,0,0
equality_flex <flex>: $eq flex!r
flexstrain: $eq flex!r cell:real[3]
tendon:
   > spatial* fixed*
spatial: $tendon width:real=0.003 material margin:real stiffness:real[1..3] damping:real[1..3]
    armature:real rgba:real[4]=0.5,0.5,0.5,1 user:real[]
   > site=spatial_site* geom=spatial_geom* pulley*
spatial_site <site>: site!r
spatial_geom <geom>: geom!r sidesite
pulley: divisor:real=-!r
fixed: $tendon margin:real stiffness:real[1..3] damping:real[1..3] armature:real user:real[]
   > joint=fixed_joint*
fixed_joint <joint>: joint!r coef:real=-!r
actuator:
   > general* motor* position* velocity* intvelocity* orientation* pid* damper* cylinder*
     muscle* adhesion* dcmotor* plugin=actuator_plugin*
general: $act_base ctrllimited:tfa forcelimited:tfa actlimited:tfa forcerange:real[2]
    actrange:real[2] $act_dyn $trn body!n actdim:int=-1 input velrange:real[2] ffrange:real[2]
    inheritrange:real dyntype:kw.dyn gaintype:kw.gain biastype:kw.bias
    dynprm:real[1..10]=1,0,0,0,0,0,0,0,0,0 gainprm:real[1..10]=1,0,0,0,0,0,0,0,0,0
    biasprm:real[1..10] actearly:bool
motor: $act_base ctrllimited:tfa forcelimited:tfa forcerange:real[2] $act_dyn $trn
position: $act_base ctrllimited:tfa forcelimited:tfa inheritrange:real forcerange:real[2]
    $act_dyn $trn kp:real kv:real dampratio:real timeconst:real
velocity: $act_base ctrllimited:tfa forcelimited:tfa forcerange:real[2] $act_dyn $trn kv:real
intvelocity: $act_base ctrllimited:tfa forcelimited:tfa actlimited:tfa forcerange:real[2]
    actrange:real[2] inheritrange:real $act_dyn $trn kp:real kv:real dampratio:real
orientation: $act_base forcelimited:tfa forcerange:real[2] joint!n site!n refsite!n kp:real
    kv:real dampratio:real input:kw.inputchart
pid: $act_base ctrllimited:tfa forcelimited:tfa posrange:real[2] velrange:real[2]
    ffrange:real[2] forcerange:real[2] inheritrange:real $act_dyn $trn kp:real kv:real
    dampratio:real ki:real imax:real slewmax:real input:flags.inputbit
damper: $act_base forcelimited:tfa forcerange:real[2] $act_dyn $trn kv:real
cylinder: $act_base ctrllimited:tfa forcelimited:tfa forcerange:real[2] $act_dyn $trn
    timeconst:real area:real diameter:real bias:real[3]
muscle: $act_base ctrllimited:tfa forcelimited:tfa forcerange:real[2] $act_dyn joint!n
    jointinparent!n tendon!n slidersite!n cranksite!n timeconst:real[2] tausmooth:real!n
    range:real[2] force:real scale:real lmin:real lmax:real vmax:real fpmax:real fvmax:real
adhesion: $act_base forcelimited:tfa forcerange:real[2] body!n gain:real
dcmotor: $act_base ctrllimited:tfa $act_dyn $trn motorconst:real[1..2] resistance:real
    nominal:real[1..3] saturation:real[1..3] inductance:real[1..2] cogging:real[1..3]
    controller:real[1..6] thermal:real[1..6] lugre:real[1..5] input:flags.inputbit
actuator_plugin <plugin>: $act_base plugin instance ctrllimited:tfa forcelimited:tfa
    actlimited:tfa forcerange:real[2] actrange:real[2] $act_dyn joint jointinparent site
    actdim:int=-1 dyntype:kw.dyn dynprm:real[1..10]=1,0,0,0,0,0,0,0,0,0 tendon cranksite
    slidersite actearly:bool
   > config*
sensor:
   > touch* accelerometer* velocimeter* gyro* force* torque* magnetometer* camprojection*
     rangefinder* jointpos* jointvel* tendonpos* tendonvel* actuatorpos* actuatorvel*
     actuatorfrc* jointactuatorfrc* tendonactuatorfrc* ballquat* ballangvel* jointlimitpos*
     jointlimitvel* jointlimitfrc* tendonlimitpos* tendonlimitvel* tendonlimitfrc* framepos*
     framequat* framexaxis* frameyaxis* framezaxis* framelinvel* frameangvel* framelinacc*
     frameangacc* subtreecom* subtreelinvel* subtreeangmom* insidesite* distance* normal*
     fromto* contact=sensor_contact* e_potential* e_kinetic* clock* tactile* user*
     plugin=sensor_plugin*
touch: $sens site!r
accelerometer: $sens site!r
velocimeter: $sens site!r
gyro: $sens site!r
force: $sens site!r
torque: $sens site!r
magnetometer: $sens site!r
camprojection: $sens site!r camera!r
rangefinder: $sens site camera data:flags.raydata
jointpos: $sens joint!r
jointvel: $sens joint!r
tendonpos: $sens tendon!r
tendonvel: $sens tendon!r
actuatorpos: $sens actuator!r
actuatorvel: $sens actuator!r
actuatorfrc: $sens actuator!r
jointactuatorfrc: $sens joint!r
tendonactuatorfrc: $sens tendon!r
ballquat: $sens joint!r
ballangvel: $sens joint!r
jointlimitpos: $sens joint!r
jointlimitvel: $sens joint!r
jointlimitfrc: $sens joint!r
tendonlimitpos: $sens tendon!r
tendonlimitvel: $sens tendon!r
tendonlimitfrc: $sens tendon!r
framepos: $sens $frameobj $frameref
framequat: $sens $frameobj $frameref
framexaxis: $sens $frameobj $frameref
frameyaxis: $sens $frameobj $frameref
framezaxis: $sens $frameobj $frameref
framelinvel: $sens $frameobj $frameref
frameangvel: $sens $frameobj $frameref
framelinacc: $sens $frameobj
frameangacc: $sens $frameobj
subtreecom: $sens body!r
subtreelinvel: $sens body!r
subtreeangmom: $sens body!r
insidesite: $sens site!r $frameobj enclosed:bool
distance: $sens geom1 geom2 body1 body2
normal: $sens geom1 geom2 body1 body2
fromto: $sens geom1 geom2 body1 body2
sensor_contact <contact>: $sens geom1 geom2 body1 body2 subtree1 subtree2 site num:int=1
    data:flags.condata reduce:kw.reduce
e_potential: $sens
e_kinetic: $sens
clock: $sens
tactile: name geom!r mesh!r nsample:int interp:kw.interp delay:real interval:real[1..2]
    cutoff:real user:real[]
user: name objtype objname datatype:kw.datatype needstage:kw.stage=acc dim:int=-!r cutoff:real
    noise:real user:real[]
sensor_plugin <plugin>: name plugin instance cutoff:real objtype objname reftype refname
    user:real[]
   > config*
custom:
   > numeric* text* tuple*
numeric: name!r size:int=-1 data:real[]
text: name!r data!r
tuple: name!r
   > element*
element: objtype!r objname!r prm:real
keyframe:
   > key*
key: name time:real qpos:real[] qvel:real[] act:real[] mpos:real[] mquat:real[] ctrl:real[]
    plastic:real[]
default_equality <equality>: active:bool=true solref:real[1..2]=0.02,1
    solimp:real[1..5]=0.9,0.95,0.001,0.5,2
default_tendon <tendon>: group:int limited:tfa actuatorfrclimited:tfa range:real[2]
    actuatorfrcrange:real[2] $solfl frictionloss:real springlength:real[1..2]=-1,-1
    springyield:real width:real=0.003 material margin:real stiffness:real[1..3]
    damping:real[1..3] armature:real rgba:real[4]=0.5,0.5,0.5,1 user:real[]
"""

# Presence rules over the attributes written on one XML element (MuJoCo checks them while
# reading). "a+b" is a bundle. exclusive: at most one bundle has any attribute present;
# oneof: at least one bundle is complete; together: all or none of the names;
# requires: the first name needs the second.
_RULES = """
size: exclusive memory nstack | exclusive memory njmax
mesh: exclusive builtin file | exclusive builtin vertex
inertial: exclusive fullinertia quat axisangle xyaxes zaxis euler
attach: exclusive body frame
camera: exclusive fovy sensorsize
light: exclusive directional type
connect: exclusive site1+site2 body1+body2+anchor | oneof site1+site2 body1+anchor
    | together site1 site2
weld: exclusive site1+site2 body1+body2+anchor+relpose | oneof site1+site2 body1
    | together site1 site2
rangefinder: exclusive site camera | oneof site camera
distance normal fromto: exclusive geom1 body1 | oneof geom1 body1 | exclusive geom2 body2
    | oneof geom2 body2
sensor_contact: exclusive geom1 body1 subtree1 site | exclusive geom2 body2 subtree2
user: together objtype objname
sensor_plugin: requires objname objtype | requires refname reftype
framepos framequat framexaxis frameyaxis framezaxis framelinvel frameangvel:
    together reftype refname
"""


def _build_rules() -> dict[str, list[tuple[str, list[tuple[str, ...]]]]]:
    rules: dict[str, list] = {}
    for head, _ in _logical_lines(_RULES):
        names, _, body = head.partition(":")
        parsed = []
        for rule in body.split("|"):
            kind, *bundles = rule.split()
            parsed.append((kind, [tuple(b.split("+")) for b in bundles]))
        for name in names.split():
            rules.setdefault(name, []).extend(parsed)
    return rules


# Attributes whose single given value is copied to every slot (MuJoCo reads them by hand).
COPY_SINGLE = {("spatial", "springlength"), ("fixed", "springlength"),
               ("default_tendon", "springlength"), ("frame", "scale")}

# Class-able elements: internal element name -> the slot of a default class that seeds it.
CLASS_SLOT = {
    "mesh": "mesh", "material": "material", "texture": "texture", "joint": "joint",
    "geom": "geom", "site": "site", "camera": "camera", "light": "light", "pair": "pair",
    "connect": "equality", "weld": "equality", "equality_joint": "equality",
    "equality_tendon": "equality", "equality_flex": "equality", "flexstrain": "equality",
    "spatial": "tendon", "fixed": "tendon",
    **{a: "actuator" for a in ("general", "motor", "position", "velocity", "intvelocity",
                               "orientation", "pid", "damper", "cylinder", "muscle",
                               "adhesion", "dcmotor", "actuator_plugin")},
}
# Default-class slot -> the element whose attribute table the slot stores.
SLOT_ELEMENT = {"mesh": "mesh", "material": "material", "texture": "texture", "joint": "joint",
                "geom": "geom", "site": "site", "camera": "camera", "light": "light",
                "pair": "pair", "equality": "default_equality", "tendon": "default_tendon",
                "actuator": "general"}
ACTUATOR_TAGS = ("general", "motor", "position", "velocity", "intvelocity", "orientation",
                 "pid", "damper", "cylinder", "muscle", "adhesion", "dcmotor")
# Elements inside the kinematic tree that take a body/frame childclass.
TREE_CLASSED = {"joint", "geom", "site", "camera", "light"}


@dataclasses.dataclass(frozen=True)
class Attr:
    """One attribute: ``kind`` in real/int/bool/tfa/kw/flags/str; ``lo``..``hi`` value count
    (hi == -1: any number); ``default`` typed (None = undefined)."""

    name: str
    kind: str
    lo: int = 1
    hi: int = 1
    enum: str | None = None
    default: object = None
    required: bool = False
    nodefault: bool = False
    array: bool = False    # written with brackets: values come back as an ndarray
    copy_single: bool = False  # one given value fills every slot (see COPY_SINGLE)


@dataclasses.dataclass(frozen=True)
class ElementSpec:
    """An element: its XML tag, attributes by name (document order) and children
    (tag -> (internal element name, cardinality))."""

    name: str
    tag: str
    attrs: dict[str, Attr]
    children: dict[str, tuple[str, str]]


_TOKEN = re.compile(r"^(\w+)(?::([\w.]+(?:\[[0-9.]*\])?))?(?:=([^!]*))?((?:![rn])*)$")


def _typed_default(kind, lo, hi, bracketed, text):
    if text == "-":
        return None
    if text is None:
        if kind == "bool":
            return False
        if kind in ("real", "int"):
            if hi == -1:
                return None
            vals = np.zeros(hi, dtype=np.float64 if kind == "real" else np.int64)
            return vals if bracketed else vals[0].item()
        return None
    if kind == "bool":
        return text == "true"
    if kind in ("real", "int"):
        conv = float if kind == "real" else int
        vals = [conv(v) for v in text.split(",")]
        if not bracketed:
            return vals[0]
        return np.array(vals, dtype=np.float64 if kind == "real" else np.int64)
    return text


def _parse_attr(token: str) -> Attr:
    m = _TOKEN.match(token)
    if m is None:
        raise ValueError(f"bad schema token {token!r}")
    name, typ, dflt, flags = m.groups()
    typ = typ or "str"
    lo = hi = 1
    bracketed = False
    enum = None
    am = re.match(r"^(real|int)\[(.*)\]$", typ)
    if am:
        kind, arity = am.groups()
        bracketed = True
        if arity == "":
            lo, hi = 0, -1
        elif ".." in arity:
            lo, hi = (int(x) for x in arity.split(".."))
        else:
            lo = hi = int(arity)
    elif "." in typ:
        kind, enum = typ.split(".")
    else:
        kind = typ
    if kind == "tfa":
        enum = "tfa"
        dflt = dflt if dflt is not None else "auto"
    if kind in ("kw",) and dflt is None:
        dflt = ENUMS[enum][0]
    default = _typed_default(kind, lo, hi, bracketed, dflt)
    return Attr(name, kind, lo, hi, enum, default, "!r" in flags, "!n" in flags, bracketed)


def _logical_lines(text: str):
    """Join continuation lines (indented, not starting with '>') onto their head line."""
    entries = []
    for raw in text.strip("\n").split("\n"):
        if not raw.strip():
            continue
        stripped = raw.strip()
        if not raw.startswith(" "):
            entries.append([stripped, ""])
        elif stripped.startswith(">"):
            entries[-1][1] += " " + stripped[1:]
        elif entries[-1][1]:
            entries[-1][1] += " " + stripped
        else:
            entries[-1][0] += " " + stripped
    return entries


def _expand(tokens, groups):
    out = []
    for tok in tokens:
        if tok.startswith("$"):
            out.extend(_expand(groups[tok[1:]].split(), groups))
        else:
            out.append(tok)
    return out


def _build() -> dict[str, ElementSpec]:
    groups = {}
    for head, kids in _logical_lines(_GROUPS):
        name, _, body = head.partition(":")
        groups[name[1:]] = body.strip()
    elements = {}
    for head, kids in _logical_lines(_ELEMENTS):
        decl, _, body = head.partition(":")
        parts = decl.split()
        name = parts[0]
        tag = parts[1].strip("<>") if len(parts) > 1 else name
        attrs = {}
        for tok in _expand(body.split(), groups):
            a = _parse_attr(tok)
            attrs[a.name] = a
        children = {}
        for tok in _expand(kids.split(), groups):
            card = tok[-1]
            ctag, _, internal = tok[:-1].partition("=")
            children[ctag] = (internal or ctag, card)
        elements[name] = ElementSpec(name, tag, attrs, children)
    return elements


ELEMENTS: dict[str, ElementSpec] = _build()
RULES = _build_rules()
ORIENTATION = ("quat", "axisangle", "xyaxes", "zaxis", "euler")


def default_slot_attrs(slot_or_tag: str) -> dict[str, Attr]:
    """Attributes settable on ``<default><TAG>``: the element's own minus name, class and
    the ``!n`` ones (MuJoCo's reduced default rows)."""
    spec = ELEMENTS[slot_or_tag]
    return {k: a for k, a in spec.attrs.items()
            if k not in ("name", "class") and not a.nodefault}
