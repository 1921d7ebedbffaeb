"""ember_proto_library: system protoc + grpc_cpp_plugin in a genrule, wrapped by a cc_library.

Bazel 4.2.3's native proto rules want the protobuf source repository, which we do not have offline.
"""

def ember_proto_library(name, src, grpc = False, deps = [], visibility = None):
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    cmd = "protoc -I. --cpp_out=$(GENDIR) "
    if grpc:
        cmd += "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$$(which grpc_cpp_plugin) "
    cmd += "$(location %s)" % src
    native.genrule(
        name = name + "_gen",
        srcs = [src] + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = cmd,
    )
    native.filegroup(name = name + "_srcs", srcs = [src])
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:grpc" if grpc else "@system//:protobuf"],
        visibility = visibility,
    )
