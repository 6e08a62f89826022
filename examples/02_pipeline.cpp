// 02_pipeline.cpp — one expression through every stage of the compiler.
//
// c = sum(relu(a @ b + 1), axis 1) with a [64,32] and b [32,16]. Prints:
//   1. the graph of primitive ops (matmul is reshape + expand + mul + reduce: no copies),
//   2. the schedule (which nodes get buffers; each kernel is one loop nest),
//   3. the loop IR as lowered, where views appear as index arithmetic,
//   4. the loop IR after the simplify pass folds that arithmetic into strides,
//   5. the C source that cc compiles, and finally the result.
//
// Build alone:  c++ -std=c++17 -O2 examples/02_pipeline.cpp -o 02_pipeline -ldl
// Run:          ./02_pipeline         (TG_DEBUG=4 prints the same stages for every realize)
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include <iostream>

using tg::Tensor;

int main() {
    Tensor a = Tensor::rand({64, 32}, 1).realize(), b = Tensor::rand({32, 16}, 2).realize();
    Tensor c = (a.matmul(b) + 1.0f).relu().sum(1);

    tg::Stages stages = tg::inspect({c});
    std::cout << "== 1. graph: one primitive op per line ==\n" << stages.graph
              << "\n== 2. schedule ==\n" << stages.schedule
              << "\n== 3. loop IR, as lowered ==\n" << stages.loop_ir
              << "\n== 4. loop IR after the passes ==\n" << stages.optimized_ir
              << "\n== 5. C source ==\n" << stages.c_source
              << "\n== result ==\n" << c << "\n";
    return 0;
}
