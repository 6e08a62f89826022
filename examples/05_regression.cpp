// 05_regression.cpp — linear, logistic and softmax regression, the three classic models.
//
// Each fits synthetic data with a known answer and prints what it learned:
//   linear:   y = 3·x0 - 2·x1 + 0.5 + noise, mean squared error, SGD → the weights come back
//   logistic: two Gaussian blobs, labels 0/1, binary cross-entropy on logits, SGD with momentum
//   softmax:  three Gaussian blobs, int32 class labels, cross-entropy, Adam
// The steps run eagerly (no jit): each step is still one compiled program, built once and then
// found in the in-memory cache, because every step has the same graph.
//
// Build alone:  c++ -std=c++17 -O2 examples/05_regression.cpp -o 05_regression -ldl
// Run:          ./05_regression       (--short: fewer steps, for the tests)
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include <cstdio>
#include <cstring>

using tg::Tensor;
namespace nn = tg::nn;

// n points around each center, standard deviation 0.5: X [k·n, 2] and the blob index of each
static std::pair<Tensor, std::vector<int32_t>> blobs(const std::vector<std::pair<float, float>>& centers, int64_t n) {
    std::vector<float> xy;
    std::vector<int32_t> label;
    for (size_t k = 0; k < centers.size(); k++)
        for (int64_t i = 0; i < n; i++) {
            xy.insert(xy.end(), {centers[k].first, centers[k].second});
            label.push_back(int32_t(k));
        }
    int64_t total = int64_t(label.size());
    Tensor X = Tensor::from_vector(xy, {total, 2}) + Tensor::randn({total, 2}, 11) * 0.5f;
    return {X.realize(), label};
}

static double accuracy(const Tensor& predicted, const Tensor& labels) {
    return (predicted == labels).cast(tg::DType::FLOAT32).mean().item();
}

int main(int argc, char** argv) {
    int steps = argc > 1 && std::strcmp(argv[1], "--short") == 0 ? 60 : 300;
    tg::manual_seed(3);

    // linear regression: the model is y = x·w + b
    Tensor X = Tensor::randn({256, 2}, 1);
    Tensor y = (X.matmul(Tensor::from_vector(std::vector<float>{3, -2})) + 0.5f + Tensor::randn({256}, 2) * 0.1f).realize();
    nn::Linear linear(2, 1);
    tg::optim::SGD sgd(linear.parameters(), 0.1);
    for (int i = 0; i < steps; i++) {
        sgd.zero_grad();
        nn::mse_loss(linear(X).reshape({-1}), y).backward();
        sgd.step();
    }
    std::vector<float> w = linear.weight.to_vector();
    std::printf("linear:   w = [%.3f, %.3f], b = %.3f   (true: [3, -2], 0.5)\n", w[0], w[1], linear.bias.item());

    // logistic regression: P(label 1) = sigmoid(x·w + b)
    auto [X2, labels2] = blobs({{-1, -1}, {1.5f, 1}}, 100);
    std::vector<float> target2(labels2.begin(), labels2.end());
    Tensor y2 = Tensor::from_vector(target2);
    nn::Linear logistic(2, 1);
    tg::optim::SGD momentum(logistic.parameters(), 0.1, /*momentum=*/0.9);
    for (int i = 0; i < steps; i++) {
        momentum.zero_grad();
        nn::binary_cross_entropy_with_logits(logistic(X2).reshape({-1}), y2).backward();
        momentum.step();
    }
    Tensor predicted2 = (logistic(X2).reshape({-1}) > 0).cast(tg::DType::FLOAT32);
    std::printf("logistic: training accuracy %.1f%%\n", 100 * accuracy(predicted2, y2));

    // softmax regression: P(class k) = softmax(x·W + b)_k
    auto [X3, labels3] = blobs({{-2, 0}, {2, 0}, {0, 2.5f}}, 100);
    Tensor y3 = Tensor::from_vector(labels3);
    nn::Linear softmax(2, 3);
    tg::optim::Adam adam(softmax.parameters(), 0.05);
    for (int i = 0; i < steps; i++) {
        adam.zero_grad();
        nn::cross_entropy(softmax(X3), y3).backward();
        adam.step();
    }
    Tensor predicted3 = softmax(X3).argmax(1);
    double acc3 = accuracy(predicted3, y3);
    std::printf("softmax:  training accuracy %.1f%%, loss %.4f\n", 100 * acc3,
                nn::cross_entropy(softmax(X3), y3).item());
    return acc3 > 0.9 ? 0 : 1;
}
