// libFuzzer entry point for the safetensors loader: make fuzz builds and runs it. The target
// itself, shared with the bounded loop that make test runs, is in tests/fuzz_targets.hpp.
#include "../fuzz_targets.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    fuzz::init();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_safetensors(data, size);
    return 0;   // libFuzzer reserves other values
}
