// Kernel counts for canonical graphs, views that are never copied, and the text of every stage.
#include "harness.hpp"
using tg::Tensor;

namespace {
int count_of(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
    return n;
}
int kernels(const Tensor& t) { return count_of("\n" + tg::inspect({t}).schedule, "\nK"); }
int temps(const Tensor& t) { return count_of(tg::inspect({t}).loop_ir, ": temp "); }
Tensor data(tg::Shape s) {
    size_t n = 1;
    for (int64_t d : s) n *= size_t(d);
    std::vector<float> v(n);
    for (size_t i = 0; i < v.size(); i++) v[i] = float(i % 7) - 3;
    return Tensor::from_vector(v, s);
}
}  // namespace

TEST(elementwise_chain_is_one_kernel) {
    Tensor a = data({8, 8}), b = data({8, 8});
    Tensor c = ((a + b) * 2.0f - a.exp()).relu().sqrt();
    CHECK_EQ(kernels(c), 1);
    CHECK_EQ(temps(c), 0);
}

TEST(broadcast_operands_are_not_materialized) {
    Tensor a = data({64, 1}), b = data({16});
    Tensor c = a * b + a.transpose(0, 1).reshape({1, 64}).sum(1, true);
    CHECK_EQ(temps(c), 1);   // only the reduction gets a buffer; a and b are read at stride 0
    std::string ir = tg::inspect({a + b}).optimized_ir;
    CHECK_EQ(count_of(ir, ": temp "), 0);
    CHECK(ir.find("(buf1[i0] + buf2[i1])") != std::string::npos);   // stride 0 along the other axis
}

TEST(matmul_bias_relu_is_one_kernel) {
    Tensor x = data({32, 30}), w = data({30, 20}), bias = data({20});
    Tensor y = (x.matmul(w) + bias).relu();
    CHECK_EQ(kernels(y), 1);
    CHECK_EQ(temps(y), 0);
    std::string c = tg::inspect({y}).c_source;
    CHECK(c.find("acc0 +=") != std::string::npos);
    CHECK(c.find("fmaxf") != std::string::npos);
}

TEST(reduction_feeding_broadcast_is_its_own_kernel) {
    Tensor x = data({4, 10});
    CHECK_EQ(kernels(x.softmax(1)), 4);   // max, exp, sum, divide
    CHECK_EQ(kernels(x.sum(1)), 1);
    CHECK_EQ(kernels(x.sum(1) * 2.0f + 1.0f), 1);
}

TEST(views_compose_to_strides) {
    Tensor x = data({6, 4});
    std::string ir = tg::inspect({x.transpose(0, 1).flip(0) + 1.0f}).optimized_ir;
    CHECK(ir.find("buf1[(i0*-1 + i1*4 + 3)]") != std::string::npos);
    ir = tg::inspect({x.reshape({24}).reshape({4, 6}) * 2.0f}).optimized_ir;
    CHECK(ir.find("buf1[(i0*6 + i1)]") != std::string::npos);
}

TEST(shared_computation_is_materialized_once) {
    Tensor x = data({5, 5});
    Tensor e = x.exp();
    Tensor y = e.sum(0) + e.sum(1);
    // e once; sum(0) fuses into the add; sum(1) loops over another shape, so it gets a kernel
    CHECK_EQ(kernels(y), 3);
}

TEST(stages_are_printable) {
    Tensor a = data({4, 3}), b = data({3, 2});
    tg::Stages st = tg::inspect({(a.matmul(b) + 1.0f).relu().sum(1)});
    CHECK(st.graph.find("REDUCE_SUM") != std::string::npos);
    CHECK(st.graph.find("EXPAND") != std::string::npos);
    CHECK(st.schedule.find("K0") != std::string::npos);
    CHECK(st.loop_ir.find("for i0 < 4") != std::string::npos);
    CHECK(st.c_source.find("void tg_program") != std::string::npos);
    CHECK(st.c_source.find("test_schedule.cpp") != std::string::npos);   // user lines in comments
}
