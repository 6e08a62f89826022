// 03_moons.cpp — a small MLP learns to separate two half moons.
//
// The half-moons demo of OCANNL: 1024 points, an MLP 2→16→16→1 with ReLU, the hinge loss
// mean(relu(1 - y·f(x))) for labels y = ±1, SGD with weight decay and a learning rate that
// decays linearly. Each training step (forward, backward, update) is one compiled program:
// tg::jit traces it on the first call and replays it afterwards, so the learning-rate
// schedule, a tensor, changes nothing that needs compiling. At the end it prints the decision
// boundary in the terminal and writes the same figure to moons.svg.
//
// Build alone:  c++ -std=c++17 -O2 examples/03_moons.cpp -o 03_moons -ldl
// Run:          ./03_moons            (--short: fewer epochs, for the tests)
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include <cstring>
#include <iostream>

using tg::Tensor;
namespace nn = tg::nn;

int main(int argc, char** argv) {
    bool short_run = argc > 1 && std::strcmp(argv[1], "--short") == 0;
    const int64_t n = 1024, batch = 32;
    const int epochs = short_run ? 25 : 75;
    tg::manual_seed(1);
    tg::data::Dataset moons = tg::data::moons(n, 0.1, /*seed=*/7);

    nn::Sequential mlp(nn::Linear(2, 16), nn::ReLU(), nn::Linear(16, 16), nn::ReLU(), nn::Linear(16, 1));
    tg::optim::SGD opt(mlp.parameters(), /*lr=*/0.1, /*momentum=*/0, /*weight_decay=*/1e-4);

    // one step: a batch of point indices in, the batch's hinge loss out
    tg::Jit step([&](const std::vector<Tensor>& in) {
        Tensor x = moons.X[in[0]], y = moons.Y[in[0]];
        Tensor loss = nn::hinge_loss(mlp(x).reshape({-1}), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });

    std::vector<double> losses;
    for (int epoch = 0; epoch < epochs; epoch++) {
        opt.set_lr(0.1 * (1.0 - 0.9 * epoch / epochs));   // linear decay towards a tenth
        double total = 0;
        std::vector<Tensor> batches = tg::data::batches(n, batch, /*seed=*/uint64_t(epoch));
        for (const Tensor& idx : batches) total += step({idx}).item();
        losses.push_back(total / double(batches.size()));
        std::printf("epoch %3d  lr %.4f  loss %.4f\n", epoch, 0.1 * (1.0 - 0.9 * epoch / epochs), losses.back());
    }

    auto score = [&](const Tensor& points) { return mlp(points).reshape({-1}); };
    double accuracy = ((score(moons.X) > 0) == (moons.Y > 0)).cast(tg::DType::FLOAT32).mean().item();
    std::printf("training accuracy %.2f%%\n\n", 100 * accuracy);
    std::cout << tg::plot::decision_boundary(score, moons.X, moons.Y) << "\n"
              << "loss per epoch\n" << tg::plot::line_chart(losses, 60, 8);
    tg::plot::decision_boundary_svg("moons.svg", score, moons.X, moons.Y);
    std::printf("wrote moons.svg\n");
    return accuracy >= 0.99 ? 0 : 1;
}
