"""cuda_library: .cu sources compiled by nvcc (from @local_cuda) into objects a cc_library links.

    load("//kernels/cuda:cuda.bzl", "cuda_library")
    cuda_library(name = "ops_cu", srcs = ["norm.cu"], hdrs = ["launch.h"])

Each .cu becomes one relocatable object holding SASS for sm_75, sm_80 and sm_90 plus compute_90
PTX (newer GPUs JIT it), built by a genrule that also writes ptxas's per-kernel register, shared
memory and spill report to <name>_<src>.ptxas.txt (tools/cuda_resources.sh reads the objects).
The objects are wrapped in a cc_library `name` that depends on @local_cuda//:cudart.

Where @local_cuda found no toolkit (CUDA_ENABLED False) `name` is an empty cc_library with the
headers only, so the CPU-only tree builds; code that calls the kernels guards on EMBER_WITH_CUDA
(defined by @local_cuda//:cudart when the toolkit exists).

nvcc sees only the .cu, its hdrs and the toolkit: keep absl, protobuf and system headers out of
.cu files (their host wrappers are ordinary .cc files).
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "CUDA_PATH")

CUDA_ARCHS = ["75", "80", "90"]
CUDA_PTX_ARCH = "90"

def _gencode_flags():
    flags = ["-gencode arch=compute_%s,code=sm_%s" % (a, a) for a in CUDA_ARCHS]
    flags.append("-gencode arch=compute_%s,code=compute_%s" % (CUDA_PTX_ARCH, CUDA_PTX_ARCH))
    return " ".join(flags)

def cuda_library(name, srcs, hdrs = [], deps = [], nvcc_flags = [], visibility = None, **kwargs):
    if not CUDA_ENABLED:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, visibility = visibility, **kwargs)
        return
    objs = []
    for src in srcs:
        stem = src.rsplit(".", 1)[0].replace("/", "_")
        obj = "_%s_%s.o" % (name, stem)
        report = "%s_%s.ptxas.txt" % (name, stem)
        native.genrule(
            name = "_%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs,
            outs = [obj, report],
            cmd = " ".join([
                CUDA_PATH + "/bin/nvcc",
                "-c $(location %s)" % src,
                "-o $(location %s)" % obj,
                "-std=c++17 -O3 -I. -I$(GENDIR) -Xcompiler -fPIC -lineinfo",
                "--expt-relaxed-constexpr",
                _gencode_flags(),
                "-Xptxas -v",
                " ".join(nvcc_flags),
                "2> $(location %s)" % report,
                "|| { cat $(location %s) >&2; exit 1; }" % report,
            ]),
            message = "nvcc %s" % src,
        )
        objs.append(obj)
    native.filegroup(name = name + "_objects", srcs = objs, visibility = visibility)
    native.filegroup(
        name = name + "_ptxas_reports",
        srcs = ["%s_%s.ptxas.txt" % (name, s.rsplit(".", 1)[0].replace("/", "_")) for s in srcs],
        visibility = visibility,
    )
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        alwayslink = True,
        visibility = visibility,
        **kwargs
    )
