// The fuzz targets outside a fuzzing build (GCC, no libFuzzer): runs
// LLVMFuzzerTestOneInput once on each file named on the command line, as a
// libFuzzer binary does when given files, so the ordinary test suite replays the
// checked-in corpus (ctest fuzz_corpus_*). Arguments starting with '-' are
// libFuzzer's flags and are skipped.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  int inputs = 0;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "replay: cannot open %s\n", argv[i]);
      return 1;
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++inputs;
  }
  std::printf("replay: %d inputs ran\n", inputs);
  return 0;
}
