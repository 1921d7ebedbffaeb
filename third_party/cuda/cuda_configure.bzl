"""Detects the CUDA toolkit (and NCCL) at configure time.

Where $CUDA_PATH (or /usr/local/cuda) holds bin/nvcc, @local_cuda exposes:
  :cuda_enabled  -> a config_setting-free constant in defs.bzl (CUDA_ENABLED = True)
  :cudart, :nccl, :cublas  -> cc_library targets linking the toolkit's libraries.
Elsewhere the same targets exist but are empty and CUDA_ENABLED = False, so the tree builds CPU-only.
Set CUDA_PATH to an empty directory to force a CPU-only build on a CUDA machine (CI does this).
"""

def _impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(cuda_path + "/bin/nvcc")
    enabled = nvcc.exists
    nccl_lib = ""
    if enabled:
        for cand in [cuda_path + "/lib", cuda_path + "/lib64", "/usr/lib/x86_64-linux-gnu"]:
            if ctx.path(cand + "/libnccl.so.2").exists or ctx.path(cand + "/libnccl.so").exists:
                nccl_lib = cand
                break
    ctx.file("defs.bzl", "CUDA_ENABLED = %s\nCUDA_PATH = \"%s\"\nNCCL_ENABLED = %s\n" % (
        "True" if enabled else "False",
        cuda_path if enabled else "",
        "True" if nccl_lib else "False",
    ))
    if enabled:
        ctx.symlink(cuda_path + "/include", "include")
        nccl_link = []
        if nccl_lib:
            nccl_link = ["-L" + nccl_lib, "-Wl,-rpath," + nccl_lib, "-l:libnccl.so.2"]
        build = """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"], allow_empty = True),
    includes = ["include"],
)
cc_library(
    name = "cudart",
    deps = [":headers"],
    defines = ["EMBER_WITH_CUDA=1"],
    linkopts = ["-L{p}/lib64", "-Wl,-rpath,{p}/lib64", "-lcudart"],
)
cc_library(name = "cublas", deps = [":cudart"], linkopts = ["-L{p}/lib64", "-lcublas", "-lcublasLt"])
cc_library(name = "nccl", deps = [":cudart"], defines = {nccl_def}, linkopts = {nccl_link})
filegroup(name = "nvcc", srcs = ["nvcc_path"])
""".format(p = cuda_path, nccl_link = repr(nccl_link),
           nccl_def = repr(["EMBER_WITH_NCCL=1"] if nccl_lib else []))
        ctx.file("nvcc_path", cuda_path + "/bin/nvcc\n")
    else:
        build = """
package(default_visibility = ["//visibility:public"])
cc_library(name = "headers")
cc_library(name = "cudart")
cc_library(name = "cublas")
cc_library(name = "nccl")
filegroup(name = "nvcc", srcs = [])
"""
    ctx.file("BUILD.bazel", build)

cuda_configure = repository_rule(
    implementation = _impl,
    environ = ["CUDA_PATH"],
    local = True,
)
