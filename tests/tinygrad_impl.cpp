// The one translation unit that compiles the implementation; tests and benchmarks link it.
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
