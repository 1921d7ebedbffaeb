// fr_analyze <dir> [--json]: explains a hang from the flight-recorder dumps in <dir>.
// Exit codes: 0 no problem found, 1 a problem found, 2 the dumps could not be read.
// (emberctl fr analyze calls the same library.)
#include <cstdio>
#include <cstring>
#include <string>

#include "runtime/flight/analyze.h"

int main(int argc, char** argv) {
  std::string dir;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) json = true;
    else if (argv[i][0] != '-' && dir.empty()) dir = argv[i];
    else {
      std::fprintf(stderr, "usage: fr_analyze <dump-dir> [--json]\n");
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: fr_analyze <dump-dir> [--json]\n");
    return 2;
  }
  auto rep = ember::fr::AnalyzeDir(dir);
  if (!rep.ok()) {
    std::fprintf(stderr, "fr analyze: %s\n", rep.status().ToString().c_str());
    return 2;
  }
  std::string out = json ? rep->ToJson() : rep->ToText();
  std::fwrite(out.data(), 1, out.size(), stdout);
  return rep->problem ? 1 : 0;
}
