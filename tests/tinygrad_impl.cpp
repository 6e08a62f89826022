// The one translation unit that compiles the implementation (the CUDA device too: it loads
// nothing until it is used); tests and benchmarks link it.
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include "../cuda_backend.hpp"
