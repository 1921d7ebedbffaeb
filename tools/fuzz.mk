# Builds the libFuzzer targets for tools/fuzz.sh (which passes OUT and CXX). Objects are shared
# between targets and rebuilt only when a source or a header it includes changes (-MMD).
OUT ?= .fuzz
CXX ?= clang++
CXXFLAGS := -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address \
            -I. -I$(OUT)/gen -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -MMD -MP
ABSL := $(patsubst /usr/lib/x86_64-linux-gnu/lib%.so,-l%,$(wildcard /usr/lib/x86_64-linux-gnu/libabsl_*.so))
LDLIBS := -Wl,--as-needed $(shell pkg-config --libs grpc++) $(ABSL) -lxxhash -lyaml-cpp -lprotobuf -lz -lspdlog -lfmt -lpthread

CKPT := checkpoint/fuzz_targets.cc checkpoint/safetensors.cc checkpoint/dtype.cc \
        checkpoint/file_util.cc checkpoint/format.cc checkpoint/checksum.cc runtime/base/json.cc \
        runtime/base/status_macros.cc runtime/base/files.cc runtime/base/utf8.cc runtime/base/dtype.cc
GEN := $(OUT)/gen/proto/job_spec.pb.cc $(OUT)/gen/proto/store.pb.cc $(OUT)/gen/proto/store_wal.pb.cc
SRC_safetensors := tests/fuzz/safetensors_fuzz.cc $(CKPT)
SRC_checkpoint_metadata := tests/fuzz/checkpoint_metadata_fuzz.cc $(CKPT)
SRC_spec := tests/fuzz/spec_fuzz.cc runtime/jobspec/spec.cc runtime/jobspec/yaml_proto.cc runtime/jobspec/pipeline_layout.cc \
            runtime/jobspec/parallel_dims.cc runtime/jobspec/enums.cc runtime/jobspec/resolve.cc runtime/base/status_macros.cc runtime/base/utf8.cc \
            $(OUT)/gen/proto/job_spec.pb.cc
SRC_wal := tests/fuzz/wal_fuzz.cc runtime/store/wal.cc runtime/base/status_macros.cc
SRC_fast_path := tests/fuzz/fast_path_fuzz.cc runtime/store/fast_path.cc \
                 runtime/store/backend.cc runtime/store/memory_backend.cc runtime/store/state.cc runtime/store/wal.cc \
                 runtime/store/wal_log.cc runtime/base/files.cc runtime/base/status_macros.cc \
                 runtime/base/clock.cc runtime/base/utf8.cc runtime/base/grpc_server.cc \
                 $(OUT)/gen/proto/store.pb.cc $(OUT)/gen/proto/store_wal.pb.cc
SRC_tcpstore_protocol := tests/fuzz/tcpstore_protocol_fuzz.cc runtime/store/tcpstore_protocol.cc
BINS := safetensors checkpoint_metadata spec wal fast_path tcpstore_protocol

obj = $(patsubst %.cc,$(OUT)/obj/%.o,$(patsubst $(OUT)/gen/%,gen/%,$(1)))

all: $(addprefix $(OUT)/bin/,$(BINS))

$(GEN): $(OUT)/gen/proto/%.pb.cc: proto/%.proto
	@mkdir -p $(OUT)/gen
	protoc --cpp_out=$(OUT)/gen -I. $<

$(OUT)/obj/gen/%.o: $(OUT)/gen/%.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(OUT)/obj/%.o: %.cc | $(GEN)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

define link
$(OUT)/bin/$(1): $(call obj,$(SRC_$(1)))
	@mkdir -p $(OUT)/bin
	$(CXX) -fsanitize=fuzzer,address -o $$@ $$^ $(LDLIBS)
endef
$(foreach b,$(BINS),$(eval $(call link,$(b))))

-include $(shell find $(OUT)/obj -name '*.d' 2>/dev/null)
.PHONY: all
