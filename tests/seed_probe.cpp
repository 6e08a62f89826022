// Prints a seeded model. The Makefile builds this file with each C++ compiler it finds (they
// evaluate a call's arguments in different orders) and links it with the implementation;
// test_reliability.cpp checks that the outputs agree.
#include "../tinygrad.hpp"
#include <cstdio>
using namespace tg;

int main() {
    manual_seed(3);
    nn::Sequential mlp(nn::Linear(2, 3), nn::ReLU(), nn::Linear(3, 1),
                       nn::Sequential(nn::Embedding(4, 2), nn::LayerNorm(2)));
    for (const Tensor& p : mlp.parameters())
        for (double v : p.to_vector<double>()) std::printf("%.9g\n", v);
}
