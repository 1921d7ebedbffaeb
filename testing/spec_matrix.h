// The generated matrix of job specs of issue 32 ("done when"): arch gpt/llama x mlp
// gelu/swiglu/moe x fp32/bf16 x layouts fsdp 1/2/4, pp2, pp2 x fsdp2, hsdp 2x2 x gradient clipping
// on/off (x publishing on/off with `with_publish`), each a small model on `world` CPU ranks.
// tests/e2e/resolve_e2e_test.cc checks that every spec spec::Resolve accepts passes the worker's
// Prepare on every rank and that every refused one names a field; the lead's integration step runs
// 3 real steps of each accepted spec from the same list (the hook: iterate SpecMatrix()).
// testonly; pure.
#ifndef EMBER_TESTING_SPEC_MATRIX_H_
#define EMBER_TESTING_SPEC_MATRIX_H_

#include <string>
#include <vector>

namespace ember::e2e {

struct MatrixSpec {
  std::string name;    // e.g. "llama-swiglu-bf16-pp2xfsdp2-clip": also the job name
  std::string yaml;    // the spec (model, optimizer, parallelism, precision, steps 3, `data`)
  int world = 1;       // ranks it runs on (parallelism.world_size is set to it)
};

struct MatrixOptions {
  std::string data = "data: {text_path: corpus.txt}";  // the data line every spec gets
  bool with_publish = false;                           // also vary publish.every_steps 0/1
};

std::vector<MatrixSpec> SpecMatrix(const MatrixOptions& o = {});

}  // namespace ember::e2e

#endif  // EMBER_TESTING_SPEC_MATRIX_H_
