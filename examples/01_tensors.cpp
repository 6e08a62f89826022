// 01_tensors.cpp — the Tensor API in one sitting.
//
// Shows creation, elementwise math with broadcasting, reductions, views, matmul and einsum,
// embedding lookup, softmax and dtypes. Everything is lazy: each printed tensor is computed by
// a small C program that tinygrad.hpp writes, compiles with cc and loads (once: the compiled
// programs are cached on disk, so a second run compiles nothing).
//
// Build alone:  c++ -std=c++17 -O2 examples/01_tensors.cpp -o 01_tensors -ldl
// Run:          ./01_tensors          (TG_DEBUG=1 ./01_tensors shows compiles and timings)
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include <iostream>

using tg::Tensor;

int main() {
    // creation: seeded random numbers are the same on every device and every run
    Tensor a = Tensor::randn({64, 32}, /*seed=*/1), b = Tensor::randn({32, 16}, /*seed=*/2);
    Tensor c = (a.matmul(b) + 1.0f).relu().sum(1);   // lazy: nothing has run yet
    std::vector<float> v = c.to_vector();            // schedule, loop IR, C, cc, dlopen, run
    std::cout << "sum(relu(a@b + 1), 1) =\n" << c << "\n\n";

    // elementwise with broadcasting: [3,1] op [4] → [3,4]
    Tensor col = Tensor::arange(3).reshape({3, 1}).cast(tg::DType::FLOAT32);
    Tensor row = Tensor::from_vector(std::vector<float>{0.5f, 1, 2, 4});
    std::cout << "col * row + 1 =\n" << col * row + 1 << "\n";
    std::cout << "exp, then sqrt of |x| =\n" << (col - row).exp().abs().sqrt() << "\n\n";

    // reductions over all elements, one axis, or several, with keepdim
    Tensor m = Tensor::arange(24).reshape({2, 3, 4});
    std::cout << "m.sum() = " << m.sum().item() << ", m.max(2) =\n" << m.max(2) << "\n";
    std::cout << "m.mean({0, 2}, keepdim) shape " << tg::shape_str(m.mean({0, 2}, true).shape())
              << ", argmax of sin(m) over axis 1 =\n" << m.sin().argmax(1) << "\n\n";

    // views: no copies until a kernel reads them
    Tensor x = Tensor::arange(6).reshape({2, 3});
    std::cout << "x.T =\n" << x.transpose(0, 1) << "\nx padded and flipped =\n"
              << x.pad({{1, 0}, {0, 1}}).flip(1) << "\nevery other column: "
              << x.slice(1, 0, 3, 2) << "\n\n";

    // einsum and an embedding lookup: C[X] with X [B,T] gives [B,T,E]
    Tensor w = Tensor::randn({3, 2}, 3);
    std::cout << "einsum(\"ij,jk->ik\") equals matmul: "
              << (tg::einsum("ij,jk->ik", {x.cast(tg::DType::FLOAT32), w}) - x.matmul(w.cast(tg::DType::FLOAT32)))
                     .abs().max().item() << "\n";
    Tensor table = Tensor::arange(10).reshape({5, 2});
    Tensor ids = Tensor::from_vector(std::vector<int32_t>{4, 0, 2, 2}, {2, 2});
    std::cout << "table[ids] =\n" << table[ids] << "\n\n";

    // softmax rows sum to one; comparisons give bool tensors; ints promote like PyTorch
    Tensor logits = Tensor::from_vector(std::vector<float>{1, 2, 3, 1, 1, 1}, {2, 3});
    std::cout << "softmax =\n" << logits.softmax(1) << "\nlogits > 1.5 =\n" << (logits > 1.5f)
              << "\nint32 / int32 is float32: " << Tensor::arange(4) / 2 << "\n";
    return 0;
}
