#include "harness.hpp"
using tg::Tensor;

TEST(smoke_matmul_relu_sum) {
    Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor b = Tensor::from_vector(std::vector<float>{1, -1, 0, 2, -3, 1}, {3, 2});
    std::vector<float> v = (a.matmul(b) + 1.0f).relu().sum(1).to_vector();
    // a@b = [[-8, 6], [-17, 12]] → +1 → relu → [[0,7],[0,13]] → sum → [7, 13]
    CHECK_ALL_NEAR(v, (std::vector<double>{7, 13}), 1e-6);
}
