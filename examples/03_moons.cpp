// 03_moons.cpp — a small MLP learns to separate two half moons.
//
// The half-moons demo of OCANNL: 1024 points, an MLP 2→16→16→1 with ReLU, the hinge loss
// mean(relu(1 - y·f(x))) for labels y = ±1, SGD with weight decay and a learning rate that
// decays linearly. Each training step (forward, backward, update) is one compiled program:
// tg::jit traces it on the first call and replays it afterwards, so the learning-rate
// schedule, a tensor, changes nothing that needs compiling. At the end it prints the decision
// boundary in the terminal and writes the same figure as an SVG file.
//
// Build alone:  c++ -std=c++17 -O2 examples/03_moons.cpp -o 03_moons -ldl
// Run:          ./03_moons [--short] [--out PATH]
//   --out PATH  where the figure goes: a directory (then PATH/moons.svg) or a file name;
//               default: moons.svg in the current directory. The full path is printed.
//   --short     fewer epochs, for the tests
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include <cerrno>
#include <climits>
#include <cstring>
#include <iostream>
#include <sys/stat.h>
#include <unistd.h>

using tg::Tensor;
namespace nn = tg::nn;

static int usage(const char* why) {
    std::fprintf(stderr, "03_moons: %s\nusage: 03_moons [--short] [--out PATH]\n", why);
    return 2;
}

int main(int argc, char** argv) {
    bool short_run = false;
    std::string out = "moons.svg";
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "--short") short_run = true;
        else if (arg != "--out") return usage(("unknown argument " + arg).c_str());
        else if (i + 1 == argc || !*argv[i + 1]) return usage("--out needs a path");
        else out = argv[++i];
    }
    struct stat st;
    if (stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        out += out.back() == '/' ? "moons.svg" : "/moons.svg";
    if (out[0] != '/') {   // announced in full, so the figure is found whatever the directory
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd)) out = std::string(cwd) + "/" + out;
    }
    // Checked before training, not after: a wrong --out should not cost the run.
    std::string dir = out.substr(0, out.rfind('/') + 1);
    if (access(dir.c_str(), W_OK) != 0) {
        std::fprintf(stderr, "03_moons: cannot write %s: %s\n", out.c_str(), std::strerror(errno));
        return 2;
    }
    const int64_t n = 1024, batch = 32;
    const int epochs = short_run ? 25 : 75;
    tg::manual_seed(1);
    tg::data::Dataset moons = tg::data::moons(n, 0.1, /*seed=*/7);

    nn::Sequential mlp(nn::Linear(2, 16), nn::ReLU(), nn::Linear(16, 16), nn::ReLU(),
                       nn::Linear(16, 1));
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
        double lr = 0.1 * (1.0 - 0.9 * epoch / epochs);   // linear decay towards a tenth
        opt.set_lr(lr);
        double total = 0;
        std::vector<Tensor> batches = tg::data::batches(n, batch, /*seed=*/uint64_t(epoch));
        for (const Tensor& idx : batches) total += step({idx}).item();
        losses.push_back(total / double(batches.size()));
        std::printf("epoch %3d  lr %.4f  loss %.4f\n", epoch, lr, losses.back());
    }

    auto score = [&](const Tensor& points) { return mlp(points).reshape({-1}); };
    Tensor correct = (score(moons.X) > 0) == (moons.Y > 0);
    double accuracy = correct.cast(tg::DType::FLOAT32).mean().item();
    std::printf("training accuracy %.2f%%\n\n", 100 * accuracy);
    std::cout << tg::plot::decision_boundary(score, moons.X, moons.Y) << "\n"
              << "loss per epoch\n" << tg::plot::line_chart(losses, 60, 8);
    try {
        tg::plot::decision_boundary_svg(out, score, moons.X, moons.Y);
    } catch (const tg::Error& e) {   // the directory can still vanish or fill up meanwhile
        std::fprintf(stderr, "03_moons: %s\n", e.what());
        return 2;
    }
    std::printf("wrote %s\n", out.c_str());
    return accuracy >= 0.99 ? 0 : 1;
}
