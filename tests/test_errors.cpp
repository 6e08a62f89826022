// Every invalid call throws tg::Error, and the message names the op and the shapes involved;
// calls that take a source location also name the caller's file:line. Shape errors are thrown
// when the graph is built; an index that is out of range is found when the program runs.
#include "harness.hpp"

using tg::DType;
using tg::Shape;
using tg::Tensor;

namespace {
// "test_errors.cpp:<line>", the location a call on that line reports
std::string at(int line) { return "(at test_errors.cpp:" + std::to_string(line) + ")"; }
Tensor zeros(const Shape& s) { return Tensor::zeros(s); }
Tensor ints(const std::vector<int32_t>& v, const Shape& s = {-1}) { return Tensor::from_vector(v, s); }
}  // namespace

TEST(errors_broadcast_mismatch) {
    Tensor a = zeros({2, 3}), b = zeros({4});
    CHECK_THROWS(a + b, "add", "[2,3]", "[4]", "broadcast");
    CHECK_THROWS(a - b, "sub", "[2,3]", "[4]");
    CHECK_THROWS(a * b, "mul", "[2,3]", "[4]");
    CHECK_THROWS(a / b, "div", "[2,3]", "[4]");
    CHECK_THROWS(a < b, "lt", "[2,3]", "[4]");
    CHECK_THROWS(a > b, "gt", "[2,3]", "[4]");
    CHECK_THROWS(a <= b, "le", "[2,3]", "[4]");
    CHECK_THROWS(a >= b, "ge", "[2,3]", "[4]");
    CHECK_THROWS(a == b, "eq", "[2,3]", "[4]");
    CHECK_THROWS(a != b, "ne", "[2,3]", "[4]");
    CHECK_THROWS(zeros({2, 3, 4}) + zeros({3, 1, 5}), "add", "[2,3,4]", "[3,1,5]");
    CHECK_THROWS(a.pow(b), "pow", "[2,3]", "[4]");
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(a.maximum(b), "maximum", "[2,3]", "[4]", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(a.minimum(b), "minimum", "[2,3]", "[4]", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(tg::where(a > 0, a, b), "where", "[2,3]", "[4]", here.c_str());
    CHECK_THROWS(tg::where(b > 0, a, 1.0f), "where", "[4]", "[2,3]");
}

TEST(errors_matmul) {
    Tensor a = zeros({32, 30}), b = zeros({20, 200});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(a.matmul(b), "matmul", "[32,30]", "[20,200]", "inner dims 30 != 20", "test_errors.cpp", here.c_str());
    CHECK_THROWS(zeros({3}).matmul(zeros({4})), "matmul", "[3]", "[4]", "inner dims 3 != 4");
    CHECK_THROWS(zeros({3}).matmul(zeros({4, 5})), "matmul", "[3]", "[4,5]");
    CHECK_THROWS(zeros({2, 3}).matmul(zeros({2})), "matmul", "[2,3]", "[2]");
    CHECK_THROWS(Tensor::zeros({}).matmul(zeros({3})), "matmul", "[]", "[3]");
    // batch axes that cannot broadcast: the message names both operands' shapes
    CHECK_THROWS(zeros({2, 3, 4}).matmul(zeros({3, 4, 5})), "matmul", "[2,3,4]", "[3,4,5]");
}

TEST(errors_axis_out_of_range) {
    Tensor x = zeros({2, 3});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(x.sum(2), "sum", "axis 2", "[2,3]", "out of range", here.c_str());
    CHECK_THROWS(x.sum(-3), "sum", "axis -3", "[2,3]");
    CHECK_THROWS(x.sum(std::vector<int>{0, 5}), "sum", "axis 5", "[2,3]");
    CHECK_THROWS(x.sum(std::vector<int>{1, -1}), "sum", "repeated", "[2,3]");
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.max(-3), "max", "axis -3", "[2,3]", here.c_str());
    CHECK_THROWS(x.min(2), "min", "axis 2", "[2,3]");
    CHECK_THROWS(x.mean(5), "mean", "axis 5", "[2,3]");
    CHECK_THROWS(x.argmax(2), "argmax", "axis 2", "[2,3]");
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.transpose(0, 2), "transpose", "axis 2", "[2,3]", here.c_str());
    CHECK_THROWS(x.unsqueeze(3), "unsqueeze", "axis 3", "[2,3]");
    CHECK_THROWS(x.unsqueeze(-4), "unsqueeze", "axis -4", "[2,3]");
    CHECK_THROWS(x.squeeze(2), "squeeze", "axis 2", "[2,3]");
    CHECK_THROWS(x.flatten(0, 2), "flatten", "axis 2", "[2,3]");
    CHECK_THROWS(x.flip(2), "flip", "axis 2", "[2,3]");
    CHECK_THROWS(x.softmax(2), "softmax", "axis 2", "[2,3]");
    CHECK_THROWS(x.log_softmax(-3), "log_softmax", "axis -3", "[2,3]");
    CHECK_THROWS(x.size(2), "axis 2", "[2,3]");
    CHECK_THROWS(x.slice(2, 0, 1), "slice", "axis 2", "[2,3]");
    CHECK_THROWS(tg::cat({x, x}, 2), "cat", "axis 2", "[2,3]");
    CHECK_THROWS(tg::stack({x, x}, 3), "stack", "axis 3", "[2,3]");
    CHECK_THROWS(x.gather(2, ints({0, 0, 0, 0, 0, 0}, {2, 3})), "gather", "axis 2", "[2,3]");
    CHECK_THROWS(x.index_select(-3, ints({0})), "index_select", "axis -3", "[2,3]");
    CHECK_THROWS(Tensor::zeros({}).sum(1), "sum", "axis 1", "[]");
}

TEST(errors_reshape_expand_permute) {
    Tensor x = zeros({2, 3});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(x.reshape({4, 2}), "reshape", "[2,3]", "[4,2]", here.c_str());
    CHECK_THROWS(x.reshape({4, -1}), "reshape", "[2,3]", "[4,-1]");
    CHECK_THROWS(x.reshape({-1, -1}), "reshape", "-1");
    CHECK_THROWS(x.reshape({-2, -3}), "reshape", "negative");
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.view({7}), "reshape", "[2,3]", "[7]", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.permute({0, 0}), "permute", "[0,0]", "[2,3]", "not a permutation", here.c_str());
    CHECK_THROWS(x.permute({0}), "permute", "[0]", "[2,3]");
    CHECK_THROWS(x.permute({0, 1, 2}), "permute", "[0,1,2]", "[2,3]");
    CHECK_THROWS(x.permute({0, 2}), "permute", "[0,2]", "[2,3]");
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.expand({4, 3}), "expand", "[2,3]", "[4,3]", here.c_str());
    CHECK_THROWS(x.expand({3}), "expand", "[2,3]", "[3]");
    CHECK_THROWS(zeros({3, 1}).expand({3, -2}), "expand", "[3,1]");
}

TEST(errors_einsum) {
    Tensor a = zeros({2, 3}), b = zeros({4, 5}), c = zeros({3, 5});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(tg::einsum("ij,jk->ik", {a}), "einsum", "ij,jk->ik", "[2,3]", "2 terms for 1 operands", here.c_str());
    CHECK_THROWS(tg::einsum("ij->ij", {a, c}), "einsum", "1 terms for 2 operands");
    CHECK_THROWS(tg::einsum("i1,jk->ik", {a, c}), "einsum", "unexpected character '1'");
    CHECK_THROWS(tg::einsum("ij,jk->ik", {a, b}), "einsum", "[2,3]", "[4,5]", "letter 'j' has sizes 3 and 4");
    CHECK_THROWS(tg::einsum("ij,jk->iz", {a, c}), "einsum", "output letter 'z' is not in any input");
    CHECK_THROWS(tg::einsum("ij,jk->ii", {a, c}), "einsum", "output letter 'i' repeated");
    CHECK_THROWS(tg::einsum("ijk,jk->i", {a, c}), "einsum", "operand 0 has 2 axes, its term names 3");
    CHECK_THROWS(tg::einsum("ii->i", {a}), "einsum", "letter 'i' has sizes 2 and 3");
    CHECK_THROWS(tg::einsum("...i...,j->ij", {a, c}), "einsum", "more than one '...'");
    CHECK_THROWS(tg::einsum("...ij,...jk->...ik", {zeros({2, 2, 3}), zeros({3, 3, 5})}), "einsum", "'...'", "broadcast");
}

TEST(errors_gather_index_dtype_and_shape) {
    Tensor src = zeros({3, 4});
    Tensor fidx = Tensor::from_vector(std::vector<float>{0, 1, 2, 0}, {1, 4});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(src.gather(0, fidx), "gather", "int32", "float32", "[3,4]", "[1,4]", here.c_str());
    CHECK_THROWS(src.gather(0, fidx.cast(DType::FLOAT64)), "gather", "int32", "float64");
    CHECK_THROWS(src.gather(0, fidx > 0), "gather", "int32", "bool");
    CHECK_THROWS(src.index_select(0, Tensor::from_vector(std::vector<float>{0, 1})), "index_select", "int32", "float32");
    CHECK_THROWS(src[Tensor::from_vector(std::vector<float>{0, 1})], "index", "int32", "float32");
    CHECK_THROWS(src.gather(0, ints({0, 1, 2})), "gather", "[3]", "[3,4]");          // rank differs
    CHECK_THROWS(src.gather(0, ints(std::vector<int32_t>(10, 0), {2, 5})), "gather", "[2,5]", "[3,4]");
    CHECK_THROWS(src.index_select(0, ints({0, 1, 0, 1}, {2, 2})), "index_select", "1-D", "[2,2]");
}

TEST(errors_gather_index_out_of_range_at_run_time) {
    Tensor src = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
    // building the graph is fine: index values are only known when the program runs
    Tensor g = src.gather(0, ints({0, 1, 3, 2}, {1, 4}));
    std::string here = at(__LINE__ - 1);
    CHECK_THROWS(g.to_vector(), "gather", "out of range", "[3,4]", "got 3", here.c_str());
    Tensor neg = src.gather(1, ints({0, -1, 2}, {1, 3}));
    CHECK_THROWS(neg.to_vector(), "out of range", "got -1");
    Tensor sel = src.index_select(1, ints({0, 7}));
    CHECK_THROWS(sel.realize(), "out of range", "got 7");
    Tensor C = Tensor::from_vector(std::vector<float>(15, 1.0f), {5, 3});
    Tensor emb = C[ints({1, 4, 5, 0}, {2, 2})];
    CHECK(emb.shape() == Shape({2, 2, 3}));
    CHECK_THROWS(emb.to_vector(), "out of range", "[5,3]", "got 5");
    // the index is checked whatever the source is: here a constant, and a computed tensor
    CHECK_THROWS(zeros({5, 3})[ints({1, 4, 5, 0}, {2, 2})].to_vector(), "out of range", "got 5");
    CHECK_THROWS(zeros({3, 4}).gather(0, ints({0, 1, 3, 2}, {1, 4})).to_vector(), "out of range", "got 3");
    CHECK_THROWS(Tensor::arange(15).reshape({5, 3})[ints({6})].to_vector(), "out of range", "got 6");
    CHECK_THROWS(tg::realize({src.gather(0, ints({9, 0, 0, 0}, {1, 4}))}), "out of range", "got 9");
    // the library stays usable after a failed run
    Tensor ok = src.gather(0, ints({2, 1, 0, 2}, {1, 4}));
    CHECK_ALL_NEAR(ok.to_vector(), (std::vector<double>{8, 5, 2, 11}), 0);
}

TEST(errors_scatter_add_and_index_add) {
    Tensor self = zeros({3, 4}), src = zeros({2, 4});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(self.scatter_add(0, ints({0, 1, 2}), src), "scatter_add", "rank", "[3,4]",
                 "[3]", "[2,4]", here.c_str());
    CHECK_THROWS(self.scatter_add(0, ints(std::vector<int32_t>(10, 0), {2, 5}), src),
                 "scatter_add", "[2,5]", "[2,4]");
    CHECK_THROWS(self.scatter_add(0, ints({0, 1}, {1, 2}), src.cast(tg::DType::FLOAT64)),
                 "scatter_add", "one dtype", "float32", "float64");
    CHECK_THROWS(self.scatter_add(0, Tensor::zeros({1, 2}), src), "scatter_add", "int32",
                 "float32");
    CHECK_THROWS(self.index_add(1, ints({0, 1}, {1, 2}), zeros({3, 2})), "index_add", "1-D",
                 "[1,2]");
    CHECK_THROWS(self.index_add(1, ints({0, 1}), zeros({3, 3})), "index_add", "[3,2]", "[3,3]");
    CHECK_THROWS(ints({1, 2}).index_add(0, ints({0}), ints({5}), 0.5), "index_add",
                 "alpha 0.5", "int32");
    // an index out of range is found when the program runs, and named with the user's line
    Tensor far = self.scatter_add(1, ints({0, 4}, {1, 2}), src);
    here = at(__LINE__ - 1);
    CHECK_THROWS(far.to_vector(), "scatter_add", "out of range", "[3,4]", "got 4", here.c_str());
    CHECK_THROWS(self.index_add(0, ints({-1, 0}), src).realize(), "index_add: index out of range",
                 "got -1");
    CHECK_THROWS(self.gather(1, ints({0, 4}, {1, 2})).realize(), "gather: index out of range",
                 "got 4");
}

TEST(errors_pad_shrink_slice) {
    Tensor x = zeros({3, 4});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS((x.pad({{-1, 0}, {0, 0}})), "pad", "(-1,0)", "[3,4]", here.c_str());
    CHECK_THROWS((x.pad({{1, 1}})), "pad", "(1,1)", "[3,4]");
    CHECK_THROWS((x.pad({{0, 0}, {0, 0}, {1, 1}})), "pad", "[3,4]");
    here = at(__LINE__ + 1);
    CHECK_THROWS((x.shrink({{0, 4}, {0, 4}})), "shrink", "(0,4)", "[3,4]", "out of range", here.c_str());
    CHECK_THROWS((x.shrink({{2, 1}, {0, 4}})), "shrink", "(2,1)", "[3,4]");
    CHECK_THROWS((x.shrink({{-1, 2}, {0, 4}})), "shrink", "(-1,2)", "[3,4]");
    CHECK_THROWS((x.shrink({{0, 1}})), "shrink", "[3,4]");
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.slice(0, 0, 3, 0), "slice", "step must be positive", "got 0", here.c_str());
    CHECK_THROWS(x.slice(0, 0, 3, -1), "slice", "step", "got -1", "flip");
    CHECK_THROWS(x.slice(2, 0, 1), "slice", "axis 2", "[3,4]");
    CHECK_THROWS(x[3], "index", "3", "[3,4]");
    CHECK_THROWS(x[-4], "index", "-4", "[3,4]");
    CHECK_THROWS(Tensor::zeros({})[0], "index");
}

TEST(errors_item_and_queries) {
    CHECK_THROWS(zeros({2, 3}).item(), "item", "[2,3]", "6 elements");
    CHECK_THROWS(zeros({0}).item(), "item", "[0]");
    CHECK_THROWS(Tensor().shape(), "undefined");
    CHECK_THROWS(Tensor().to_vector(), "undefined");
    CHECK_THROWS(Tensor() + zeros({2}), "undefined");
}

TEST(errors_creation) {
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2}), "from_vector", "3 values", "[2,2]", here.c_str());
    CHECK_THROWS(Tensor::from_vector(std::vector<int32_t>{1, 2}, {3}), "from_vector", "2 values", "[3]");
    CHECK_THROWS(Tensor::from_vector(std::vector<double>{1, 2}, {-1, -2}), "from_vector", "negative");
    here = at(__LINE__ + 1);
    CHECK_THROWS(Tensor::zeros({-1, 2}), "negative", "[-1,2]", here.c_str());
    CHECK_THROWS(Tensor::full({2, -3}, 1.0), "full", "negative", "[2,-3]");
    CHECK_THROWS(Tensor::rand({-4}, 1), "rand", "negative", "[-4]");
    CHECK_THROWS(Tensor::randn({-4}, 1), "randn", "negative", "[-4]");
    CHECK_THROWS(Tensor::arange(0, 10, 0), "arange", "step");
    CHECK_THROWS(Tensor::eye(-1), "eye", "-1");
}

TEST(errors_dtypes) {
    Tensor b = zeros({2}) > 0;
    CHECK_THROWS(b - b, "sub", "bool");
    CHECK_THROWS(-b, "neg", "bool");
    CHECK_THROWS(zeros({2}).cast(DType::INDEX), "cast", "index");
}

TEST(errors_cat_stack) {
    Tensor a = zeros({2, 3}), b = zeros({2, 4});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(tg::cat({a, b}, 0), "cat", "[2,3]", "[2,4]", here.c_str());
    CHECK_THROWS(tg::cat({a, zeros({3})}, 0), "cat", "[2,3]", "[3]");
    CHECK_THROWS(tg::cat({}, 0), "cat");
    here = at(__LINE__ + 1);
    CHECK_THROWS(tg::stack({a, zeros({3, 2})}), "stack", "[2,3]", "[3,2]", here.c_str());
    CHECK_THROWS(tg::stack({}), "stack");
}

TEST(errors_name_callers_file) {
    // every method that takes a location reports the caller's file:line
    Tensor x = zeros({2, 3});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(x.sum(7), here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.mean(7), here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.reshape({5}), here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.matmul(x), here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.softmax(3), here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.gather(0, x), here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.index_select(0, x), here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(tg::einsum("ij,jk", {x, x}), here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.slice(0, 0, 9, -1), here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.flip(5), here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(x.pow(zeros({4})), here.c_str());
}

// The modules' forwards that take states or masks besides the input name the caller's line too
// (a module called as m(x) does through its operator()).
TEST(errors_from_forwards_with_states_name_the_line) {
    namespace nn = tg::nn;
    nn::GRU gru(3, 4);
    nn::LSTM lstm(3, 4);
    nn::LSTMCell cell(3, 4);
    nn::MultiheadAttention attention(6, 2);
    Tensor x = zeros({5, 2, 3});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(gru.forward(x, zeros({1, 2, 4}), zeros({1, 2, 4})), "GRU", "c_0", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(lstm.forward(x, zeros({1, 2, 5})), "LSTM", "h_0", "[1,2,5]", here.c_str());
    tg::nn::PackedSequence packed = tg::nn::pack_padded_sequence(zeros({5, 2, 7}), {5, 3});
    here = at(__LINE__ + 1);
    CHECK_THROWS(lstm.forward(packed), "LSTM", "packed", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(cell.forward(zeros({2, 5}), zeros({2, 4})), "LSTMCell", "[2,5]", here.c_str());
    Tensor q = zeros({4, 2, 6});
    here = at(__LINE__ + 1);
    CHECK_THROWS(attention.forward(q, zeros({4, 2, 5}), q), "MultiheadAttention", here.c_str());
}

// Layers', optimizers' and schedules' constructors check their arguments, and they, the
// checkpoints' loads and saves, the data helpers, a jitted or data-parallel step and item()
// name the caller's line: what the library builds inside them is attributed to it.
#define CHECK_THROWS_HERE(expr, ...)                                                           \
    do {                                                                                       \
        std::string here_ = at(__LINE__);                                                      \
        CHECK_THROWS(expr, __VA_ARGS__, here_.c_str());                                        \
    } while (0)
TEST(errors_from_constructors_and_steps_name_the_line) {
    namespace nn = tg::nn;
    namespace optim = tg::optim;
    CHECK_THROWS_HERE(nn::Linear(0, 3), "Linear", "in 0");
    CHECK_THROWS_HERE(nn::Linear(-2), "Linear", "-2");
    CHECK_THROWS_HERE(nn::Embedding(-1, 3), "[-1,3]");
    CHECK_THROWS_HERE(nn::LayerNorm(-1), "[-1]");
    CHECK_THROWS_HERE(nn::GroupNorm(3, 4), "GroupNorm", "3 groups");
    CHECK_THROWS_HERE(nn::BatchNorm2d(0), "BatchNorm2d", "num_features");
    CHECK_THROWS_HERE(nn::Dropout(2), "Dropout", "p must be in [0, 1]");
    CHECK_THROWS_HERE(nn::Hardtanh(1, 0), "Hardtanh", "min_val");
    CHECK_THROWS_HERE(nn::Softshrink(-1), "Softshrink", "lambd");
    CHECK_THROWS_HERE(nn::PReLU(0), "PReLU", "num_parameters");
    CHECK_THROWS_HERE(nn::Conv2d(3, 4, 3, 1, 0, 1, 2), "Conv2d", "groups 2");
    CHECK_THROWS_HERE(nn::Conv1d(3, 4, 3, 1, 0, 1, 1, true, "mirror"), "Conv1d", "mirror");
    CHECK_THROWS_HERE(nn::ConvTranspose2d(3, 4, 0), "ConvTranspose2d", "kernel_size");
    CHECK_THROWS_HERE(nn::CausalSelfAttention(10, 3), "CausalSelfAttention", "heads 3");
    CHECK_THROWS_HERE(nn::CausalSelfAttention(10, 2, 1.5), "Dropout", "1.5");
    CHECK_THROWS_HERE(nn::MultiheadAttention(10, 3), "MultiheadAttention", "num_heads 3");
    CHECK_THROWS_HERE(nn::TransformerBlock(10, 3), "CausalSelfAttention", "heads 3");
    CHECK_THROWS_HERE(nn::LSTM(3, 4, 0), "LSTM", "num_layers");
    CHECK_THROWS_HERE(nn::GRU(3, 4, 1, true, false, -0.5), "Dropout", "-0.5");
    CHECK_THROWS_HERE(nn::RNN(3, 4, 1, "sigmoid"), "RNN", "sigmoid");
    CHECK_THROWS_HERE(nn::RNNCell(3, 4, true, "x"), "RNNCell", "\"x\"");
    CHECK_THROWS_HERE(nn::GRUCell(0, 4), "GRUCell", "input_size 0");
    CHECK_THROWS_HERE(nn::init::kaiming_uniform({-3}, 1), "[-3]");

    nn::Sequential model(nn::Linear(2, 3));
    CHECK_THROWS_HERE(model.at<nn::Conv2d>(0), "ModuleList", "type");
    CHECK_THROWS_HERE(model.at(3), "ModuleList", "layer 3 of 1");
    CHECK_THROWS_HERE(model.add(nullptr), "ModuleList", "empty layer pointer");
    CHECK_THROWS_HERE(model.load_state_dict({{"0.weight", zeros({3})}}), "0.weight", "[3,2]");

    std::vector<Tensor> params = model.parameters();
    CHECK_THROWS_HERE(optim::SGD(params, -1), "lr must be at least 0", "-1");
    CHECK_THROWS_HERE(optim::SGD(params, 0.1, -0.9), "SGD", "momentum");
    CHECK_THROWS_HERE(optim::SGD(params, 0.1, 0, 0, true), "SGD", "nesterov");
    CHECK_THROWS_HERE(optim::Adam(params, 1e-3, 1.0), "Adam", "betas", "[0, 1)");
    CHECK_THROWS_HERE(optim::AdamW(params, 1e-3, 0.9, 0.999, -1e-8), "AdamW", "eps");
    CHECK_THROWS_HERE(optim::RMSprop(params, 1e-2, -0.5), "RMSprop", "alpha");
    CHECK_THROWS_HERE(optim::Adagrad(params, 1e-2, 0, -1), "Adagrad", "weight_decay");
    CHECK_THROWS_HERE(optim::Adagrad(params, 1e-2, 0, 0, -0.1), "initial_accumulator_value");
    CHECK_THROWS_HERE(optim::SGD({zeros({3})}, 0.1), "does not require grad");
    CHECK_THROWS_HERE(optim::warmup_cosine(1, -1, 10), "warmup_cosine");
    CHECK_THROWS_HERE(optim::step_lr(1, 0), "step_lr");
    CHECK_THROWS_HERE(optim::exponential_lr(1, 0), "exponential_lr");
    CHECK_THROWS_HERE(optim::cosine_annealing_lr(1, 0), "cosine_annealing_lr");
    CHECK_THROWS_HERE(optim::linear_lr(1, 0), "linear_lr");
    optim::SGD sgd(params, 0.1);
    CHECK_THROWS_HERE(sgd.set_lr(-0.5), "set_lr", "-0.5");
    CHECK_THROWS_HERE(sgd.load_state_dict({{"t", zeros({})}}), "lr is missing");
    CHECK(std::abs(sgd.lr.item() - 0.1) < 1e-7);   // the refused rate was not written

    auto loss = [](const std::vector<Tensor>& shard) { return shard[0].sum(); };
    CHECK_THROWS_HERE(tg::DataParallel({}, sgd, loss), "DataParallel", "no devices");
    tg::DataParallel two({"CPU:0", "CPU:1"}, sgd, loss);
    CHECK_THROWS_HERE(two({zeros({1})}), "DataParallel", "1 rows");
    CHECK_THROWS_HERE(two({zeros({4}), zeros({3})}), "DataParallel", "[4]", "[3]");
    CHECK_THROWS_HERE(tg::DataParallel::split(4, 0), "split");
    tg::Jit doubled([](const std::vector<Tensor>& in) { return in[0] * 2; });
    doubled({zeros({3})});
    CHECK_THROWS_HERE(doubled({zeros({3}), zeros({3})}), "jit", "1 inputs", "2");

    CHECK_THROWS_HERE(tg::safetensors::load("/nonexistent/model.safetensors"), "cannot read");
    CHECK_THROWS_HERE(tg::safetensors::load_bytes("short"), "too short");
    CHECK_THROWS_HERE(tg::safetensors::save("/nonexistent/m.safetensors", {{"a", zeros({2})}}),
                      "cannot write");
    CHECK_THROWS_HERE(tg::data::moons(1), "moons");
    CHECK_THROWS_HERE(tg::data::batches(10, 0, 1), "batches");
    auto score = [](const Tensor& p) { return p.sum(1); };
    CHECK_THROWS_HERE(tg::plot::decision_boundary(score, zeros({4, 3}), zeros({4})), "plot");
    CHECK_THROWS_HERE(zeros({3}).item(), "item", "3 elements");
    CHECK_THROWS_HERE(ints({1, 2}).requires_grad(), "requires_grad", "int32");
    Tensor w = zeros({3}).requires_grad();
    CHECK_THROWS_HERE(tg::gradients(zeros({3}).sum(), {w}), "does not depend");
    CHECK_THROWS_HERE(tg::inspect({Tensor()}), "undefined");
    CHECK_THROWS_HERE(nn::clip_grad_norm_({w, Tensor()}, 1.0), "undefined");
}

// A tensor never assigned, as an operand of the usual first calls (operators, reductions,
// products, reshapes, casts, where, elementwise math) or read: the error names the op and the
// line.
TEST(errors_from_undefined_operands_name_the_op_and_line) {
    Tensor never, x = zeros({2, 3});
    const char* undefined = "undefined (default-constructed and never assigned)";
    CHECK_THROWS_HERE(never + x, "add", undefined);
    CHECK_THROWS_HERE(x * never, "mul", undefined);
    CHECK_THROWS_HERE(never.sum(), "sum", undefined);
    CHECK_THROWS_HERE(never.mean(0), "mean", undefined);
    CHECK_THROWS_HERE(never.max(1), "max", undefined);
    CHECK_THROWS_HERE(never.exp(), undefined);
    CHECK_THROWS_HERE(x.matmul(never), "matmul", undefined);
    CHECK_THROWS_HERE(never.reshape({6}), "reshape", undefined);
    CHECK_THROWS_HERE(never.mT(), "mT", undefined);
    CHECK_THROWS_HERE(never.transpose(0, 1), "transpose", undefined);
    CHECK_THROWS_HERE(never.cast(DType::INT32), "cast", undefined);
    CHECK_THROWS_HERE(tg::where(x > 0, never, x), "where", undefined);
    CHECK_THROWS_HERE(never.item(), "item", undefined);
    CHECK_THROWS_HERE(never.to_vector(), "to_vector", undefined);
    CHECK_THROWS_HERE(never.to_vector<int>(), "to_vector", undefined);
    CHECK_THROWS_HERE(never.realize(), "realize", undefined);
    CHECK_THROWS_HERE(tg::realize({x, never}), "realize", undefined);
    // a scalar operand, and the calls that first read the shape or dtype of an operand
    Tensor i = Tensor::from_vector({0, 1});
    CHECK_THROWS_HERE(never + 1, "operator+", undefined);
    CHECK_THROWS_HERE(2 * never, "operator*", undefined);
    CHECK_THROWS_HERE(never < 1, "operator<", undefined);
    CHECK_THROWS_HERE(-never, "neg", undefined);
    CHECK_THROWS_HERE(never.maximum(1), "maximum", undefined);
    CHECK_THROWS_HERE(never.pow(2), "pow", undefined);
    CHECK_THROWS_HERE(tg::where(x > 0, 1.0f, never), "where", undefined);
    CHECK_THROWS_HERE(Tensor::zeros_like(never), "full_like", undefined);
    CHECK_THROWS_HERE(Tensor::randn_like(never), "randn_like", undefined);
    CHECK_THROWS_HERE(never.sign(), "sign", undefined);
    CHECK_THROWS_HERE(never.abs(), "abs", undefined);
    CHECK_THROWS_HERE(never.square(), "square", undefined);
    CHECK_THROWS_HERE(never.floor(), "floor", undefined);
    CHECK_THROWS_HERE(never.ceil(), "ceil", undefined);
    CHECK_THROWS_HERE(never.trunc(), "trunc", undefined);
    CHECK_THROWS_HERE(never.logical_not(), "logical_not", undefined);
    CHECK_THROWS_HERE(never.clamp(0, 1), "clamp", undefined);
    CHECK_THROWS_HERE(x.masked_fill(never, 1), "masked_fill", undefined);
    CHECK_THROWS_HERE(never.min(0), "min", undefined);
    CHECK_THROWS_HERE(never.prod(), "prod", undefined);
    CHECK_THROWS_HERE(never.cumsum(0), "cumsum", undefined);
    CHECK_THROWS_HERE(never.argmax(), "argmax", undefined);
    CHECK_THROWS_HERE(never.argmin(0), "argmin", undefined);
    CHECK_THROWS_HERE(never.std(), "var", undefined);
    CHECK_THROWS_HERE(never.t(), "t:", undefined);
    CHECK_THROWS_HERE(never.pad({{1, 1}}), "pad", undefined);
    CHECK_THROWS_HERE(never.slice(0, 0, 1), "slice", undefined);
    CHECK_THROWS_HERE(never.flip(0), "flip", undefined);
    CHECK_THROWS_HERE(never.squeeze(), "squeeze", undefined);
    CHECK_THROWS_HERE(never.unsqueeze(0), "unsqueeze", undefined);
    CHECK_THROWS_HERE(never.flatten(), "flatten", undefined);
    CHECK_THROWS_HERE(never.clone(), "contiguous", undefined);
    CHECK_THROWS_HERE(never.tril(), "tril", undefined);
    CHECK_THROWS_HERE(never.roll(1, 0), "roll", undefined);
    CHECK_THROWS_HERE(never.repeat({2}), "repeat", undefined);
    CHECK_THROWS_HERE(never.chunk(2), "chunk", undefined);
    CHECK_THROWS_HERE(never.split(1), "split", undefined);
    CHECK_THROWS_HERE(x.mm(never), "mm", undefined);
    CHECK_THROWS_HERE(never.bmm(x), "bmm", undefined);
    CHECK_THROWS_HERE(x.gather(0, never), "gather", undefined);
    CHECK_THROWS_HERE(x.scatter_add(0, i, never), "scatter_add", undefined);
    CHECK_THROWS_HERE(x.index_add(0, i, never), "index_add", undefined);
    CHECK_THROWS_HERE(never[i], "index", undefined);
    CHECK_THROWS_HERE(never[0], "index", undefined);
    CHECK_THROWS_HERE(never.assign(x), "assign", undefined);
    CHECK_THROWS_HERE(tg::cat({x, never}), "cat", undefined);
    CHECK_THROWS_HERE(tg::stack({x, never}), "stack", undefined);
    CHECK_THROWS_HERE(tg::einsum("ij->ji", {never}), "einsum", undefined);
}

// A layer norm's x must end in the shape it normalizes over, and its weight and bias must fit.
TEST(errors_layer_norm_names_the_width_it_needs) {
    tg::nn::LayerNorm norm(4);
    Tensor x = zeros({2, 5});
    CHECK_THROWS_HERE(norm(x), "layer_norm", "x [2,5] does not end in normalized_shape [4]");
    CHECK_THROWS_HERE(tg::nn::functional::layer_norm(x, zeros({4})), "layer_norm",
                      "weight [4] does not fit x [2,5]", "axes, [5]");
    CHECK_THROWS_HERE(tg::nn::functional::layer_norm(x, Tensor(), zeros({4})), "bias [4]");
    CHECK_THROWS_HERE(tg::nn::functional::layer_norm(x, {3, 5}), "[2,5]", "[3,5]");
    CHECK_THROWS_HERE(tg::nn::functional::layer_norm(zeros({}), tg::Shape{}), "layer_norm", "[]");
    CHECK_THROWS_HERE(tg::nn::functional::layer_norm(zeros({})), "layer_norm", "scalar");
    CHECK_EQ(norm(zeros({2, 4})).shape(), (tg::Shape{2, 4}));
}

// An embedding's padding_idx must name one of its rows.
TEST(errors_embedding_padding_idx_out_of_range) {
    CHECK_THROWS_HERE(tg::nn::Embedding(5, 2, 5), "Embedding", "padding_idx 5", "5 embeddings");
    CHECK_THROWS_HERE(tg::nn::Embedding(5, 2, -6), "Embedding", "padding_idx -6");
    Tensor ids = Tensor::from_vector(std::vector<int32_t>{0, 1});
    CHECK_THROWS_HERE(tg::nn::functional::embedding(ids, zeros({3, 2}), 3), "embedding",
                      "padding_idx 3", "3 embeddings");
}

// Operators take the user's line through the conversion of their left operand (or of an index).
TEST(errors_from_operators_name_the_line) {
    Tensor a = zeros({3}), b = zeros({4});
    std::string here = at(__LINE__ + 1);
    CHECK_THROWS(a + b, "add", "[3]", "[4]", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(a - b, "sub", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(a / b, "div", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(a >= b, "ge", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(-(a > 0), "neg", "bool", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(a[3], "index", "3 out of range", "[3]", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(a[a], "index", "int32", here.c_str());
    here = at(__LINE__ + 1);
    CHECK_THROWS(Tensor::zeros({})[0], "0-d", here.c_str());
}

TEST(nodes_from_operators_carry_the_line) {
    Tensor a = Tensor::ones({2, 3}), b = Tensor::ones({3});
    int line = __LINE__ + 1;
    Tensor c = -(a * 2.0f + b) / 3.0f;
    std::string where = "test_errors.cpp:" + std::to_string(line);
    tg::Stages st = tg::inspect({c});
    CHECK(st.graph.find(where) != std::string::npos);
    CHECK(st.graph.find(" ?") == std::string::npos);
    CHECK(st.schedule.find(where) != std::string::npos);
    CHECK(st.c_source.find(where) != std::string::npos);
}
