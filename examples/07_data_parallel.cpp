// 07_data_parallel.cpp — one model trained on several devices at once, and on one.
//
// Data parallelism as in OCANNL's slides: each step splits the batch over the devices, every
// device runs the forward and backward of its rows (one compiled program, prepared once per
// device), the gradients are merged pairwise in a fixed tree, the first device updates the
// parameters and the others read them for the next step. Here the devices are CPU:0 and CPU:1
// (more with --devices), each with its own queue thread and half of the machine's threads.
//
// The task is 03_moons' (1024 points, MLP 2→16→16→1, hinge loss, SGD with momentum). The
// same model from the same initial values is also trained on one device, on the same batches:
// the two differ only by float rounding (a batch's gradient is summed in another order), and
// the program prints by how much, with each device's time, the merge's and the update's.
//
// Build alone:  c++ -std=c++17 -O2 examples/07_data_parallel.cpp -o 07_data_parallel -ldl
// Run:          ./07_data_parallel [--devices N] [--epochs E] [--short]
//   --devices N  CPU devices to split each batch over (default 2)
//   --epochs E   passes over the 1024 points (default 40; --short: 8)
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

using tg::Tensor;
namespace nn = tg::nn;

static int usage(const char* why) {
    std::fprintf(stderr, "07_data_parallel: %s\nusage: 07_data_parallel [--devices N] "
                         "[--epochs E] [--short]\n", why);
    return 2;
}

// The model and its optimizer, from the same seed each time it is made.
struct Model {
    nn::Sequential mlp{nn::Linear(2, 16), nn::ReLU(), nn::Linear(16, 16), nn::ReLU(),
                       nn::Linear(16, 1)};
    tg::optim::SGD opt{mlp.parameters(), /*lr=*/0.05, /*momentum=*/0.9, /*weight_decay=*/1e-4};
};

int main(int argc, char** argv) {
    int devices = 2, epochs = 40;
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        bool valued = arg == "--devices" || arg == "--epochs";
        if (arg == "--short") epochs = 8;
        else if (!valued) return usage(("unknown argument " + arg).c_str());
        else if (i + 1 == argc || std::atoi(argv[i + 1]) < 1)
            return usage((arg + " needs a whole number of at least 1").c_str());
        else (arg == "--devices" ? devices : epochs) = std::atoi(argv[++i]);
    }
    const int64_t n = 1024, batch = 64;
    tg::data::Dataset moons = tg::data::moons(n, 0.1, /*seed=*/7);
    std::vector<std::string> names;
    for (int k = 0; k < devices; k++) names.push_back("CPU:" + std::to_string(k));

    tg::manual_seed(1);
    Model many;
    tg::manual_seed(1);
    Model one;
    // the loss of one device's rows; the shard holds that device's point indices
    auto loss_of = [&](Model& m) {
        return [&](const std::vector<Tensor>& shard) {
            Tensor x = moons.X[shard[0]], y = moons.Y[shard[0]];
            return nn::hinge_loss(m.mlp(x).reshape({-1}), y);
        };
    };
    tg::DataParallel parallel(names, many.opt, loss_of(many));
    tg::DataParallel single({"CPU:0"}, one.opt, loss_of(one));

    int threads = std::max(1, tg::threads() / devices);
    std::printf("moons on %d devices (%s ... %s), %d thread%s each, and on one device\n",
                devices, names.front().c_str(), names.back().c_str(), threads,
                threads == 1 ? "" : "s");
    std::printf("%6s %12s %12s %24s %10s %10s\n", "epoch", "loss", "one device",
                "per device (ms a step)", "merge", "update");
    for (int epoch = 0; epoch < epochs; epoch++) {
        double loss = 0, loss_one = 0, merge = 0, update = 0;
        std::vector<double> per_device(size_t(devices), 0);
        std::vector<Tensor> batches = tg::data::batches(n, batch, /*seed=*/uint64_t(epoch));
        for (const Tensor& idx : batches) {
            loss += parallel({idx}).item();
            loss_one += single({idx}).item();
            tg::DataParallel::Times t = parallel.last_times();
            for (int k = 0; k < devices; k++) per_device[size_t(k)] += t.device_ms[size_t(k)];
            merge += t.merge_ms;
            update += t.update_ms;
        }
        double steps = double(batches.size());
        if (epoch % std::max(1, epochs / 8) && epoch != epochs - 1) continue;
        std::string each;
        for (double ms : per_device) {
            char one_device[32];
            std::snprintf(one_device, sizeof one_device, "%s%.4f", each.empty() ? "" : " ",
                          ms / steps);
            each += one_device;
        }
        std::printf("%6d %12.6f %12.6f %24s %10.4f %10.4f\n", epoch + 1, loss / steps,
                    loss_one / steps, each.c_str(), merge / steps, update / steps);
    }

    // how far apart the two runs ended
    std::vector<Tensor> a = many.mlp.parameters(), b = one.mlp.parameters();
    double largest = 0, norm = 0;
    for (size_t i = 0; i < a.size(); i++) {
        std::vector<float> va = a[i].to_vector(), vb = b[i].to_vector();
        for (size_t j = 0; j < va.size(); j++) {
            largest = std::max(largest, std::fabs(double(va[j]) - vb[j]));
            norm = std::max(norm, std::fabs(double(vb[j])));
        }
    }
    auto accuracy = [&](Model& m) {
        Tensor right = (m.mlp(moons.X).reshape({-1}) > 0) == (moons.Y > 0);
        return right.cast(tg::DType::FLOAT32).mean().item();
    };
    std::printf("accuracy: %.4f on %d devices, %.4f on one\n", accuracy(many), devices,
                accuracy(one));
    std::printf("parameters: largest difference %.3g (largest parameter %.3g)\n", largest, norm);
    return largest <= 1e-4 * (1 + norm) ? 0 : 1;
}
