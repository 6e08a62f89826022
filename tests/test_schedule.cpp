// Kernel counts for canonical graphs, views that are never copied, and the text of every stage.
#include "harness.hpp"
#include <algorithm>
using tg::Tensor;

namespace {
int kernels(const Tensor& t) { return th::count_of("\n" + tg::inspect({t}).schedule, "\nK"); }
int kernels_of(const std::vector<Tensor>& ts) {
    return th::count_of("\n" + tg::inspect(ts).schedule, "\nK");
}
int temps(const Tensor& t) { return th::count_of(tg::inspect({t}).loop_ir, ": temp "); }
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
    CHECK_EQ(temps(c), 0);   // the sum is computed in the kernel, before its loops; a and b
                             // are read at stride 0
    std::string ir = tg::inspect({a + b}).optimized_ir;
    CHECK_EQ(th::count_of(ir, ": temp "), 0);
    CHECK(ir.find("(buf1[i0] + buf2[i1])") != std::string::npos);   // stride 0 along the other axis
}

TEST(matmul_bias_relu_is_one_kernel) {
    Tensor x = data({32, 30}), w = data({30, 20}), bias = data({20});
    Tensor y = (x.matmul(w) + bias).relu();
    CHECK_EQ(kernels(y), 1);
    CHECK_EQ(temps(y), 0);
    std::string c = tg::inspect({y}).c_source;
    CHECK(c.find("acc0 +=") != std::string::npos);
    CHECK(c.find("tg_wheref") != std::string::npos);
}

// A pad of nothing is the tensor itself, whatever the value: a max pool of padding 0 pads
// with -inf, which was a select of the ReLU before it, stored beside the ReLU for the pool's
// gather to read (C1's first layer: 8 MB stored twice a step). Now the ReLU is stored once.
TEST(pad_of_nothing_is_the_tensor_itself) {
    Tensor x = data({2, 4, 8, 8});
    std::vector<std::pair<int64_t, int64_t>> none(4, {0, 0});
    CHECK_EQ(th::count_of(tg::inspect({x.pad(none, -INFINITY) * 2.0f}).graph, "\n"),
             th::count_of(tg::inspect({x * 2.0f}).graph, "\n"));
    Tensor r = x.relu(), pooled = tg::nn::functional::max_pool2d(r, 2);
    std::string schedule = tg::inspect({r, pooled}).schedule;
    CHECK_EQ(th::count_of(schedule, ": WHERE\n"), 0);
    std::vector<float> rv = r.to_vector(), pv = pooled.to_vector();
    for (size_t c = 0; c < 8; c++)
        for (size_t i = 0; i < 4; i++)
            for (size_t j = 0; j < 4; j++) {
                const float* w = &rv[c * 64 + i * 16 + j * 2];
                CHECK_EQ(pv[c * 16 + i * 4 + j], std::max({w[0], w[1], w[8], w[9]}));
            }
}

// Kernels that run the same code over other buffers (a model's layers, a recurrent layer's
// steps) share one C function, each called with its own buffers; one of other sizes has its own
TEST(kernels_of_the_same_code_share_a_function) {
    auto filled = [](tg::Shape s, uint64_t seed) {
        return Tensor::from_vector(th::randf(size_t(s[0] * (s.size() > 1 ? s[1] : 1)), seed), s);
    };
    Tensor x = filled({64, 128}, 1), w1 = filled({128, 128}, 2), w2 = filled({128, 128}, 3);
    Tensor b1 = filled({128}, 4), b2 = filled({128}, 5), w3 = filled({4, 128}, 6);
    Tensor h1 = (x.matmul(w1.t()) + b1).tanh(), h2 = (h1.matmul(w2.t()) + b2).tanh();
    Tensor y = h2.matmul(w3.t());
    std::string c = tg::inspect({y}).c_source;
    CHECK_EQ(kernels(y), 3);
    CHECK_EQ(th::count_of(c, "__attribute__((noinline)) void k"), 2);
    CHECK_EQ(th::count_of(c, "runs k0's code"), 1);
    CHECK(c.find("    k0(") != std::string::npos && c.find("    k1(") == std::string::npos);
    // against loops in double
    std::vector<float> xv = x.to_vector(), w1v = w1.to_vector(), w2v = w2.to_vector();
    std::vector<float> b1v = b1.to_vector(), b2v = b2.to_vector(), w3v = w3.to_vector();
    auto layer = [](const std::vector<double>& in, const std::vector<float>& w,
                    const std::vector<float>& b, int64_t outs, bool squash) {
        const int64_t rows = 64, ins = int64_t(in.size()) / rows;
        std::vector<double> out(size_t(rows * outs));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t o = 0; o < outs; o++) {
                double acc = b.empty() ? 0 : b[size_t(o)];
                for (int64_t i = 0; i < ins; i++)
                    acc += in[size_t(r * ins + i)] * w[size_t(o * ins + i)];
                out[size_t(r * outs + o)] = squash ? std::tanh(acc) : acc;
            }
        return out;
    };
    std::vector<double> want = layer(layer(layer(std::vector<double>(xv.begin(), xv.end()), w1v,
                                                 b1v, 128, true),
                                           w2v, b2v, 128, true),
                                     w3v, {}, 4, false);
    CHECK_ALL_NEAR(y.to_vector<double>(), want, 1e-5);
}

// Bounds-checked kernels of one line (a loop's steps, each permuting the last one's rows) share
// a function: their checks, of one message and line, share a site, which the code names
TEST(checked_kernels_of_one_line_share_a_function) {
    std::vector<float> twelve(12);
    for (size_t i = 0; i < twelve.size(); i++) twelve[i] = float(i);
    Tensor x = Tensor::from_vector(twelve, {4, 3});
    Tensor order = Tensor::from_vector(std::vector<int64_t>{1, 0, 3, 2});
    for (int step = 0; step < 3; step++) x = (x.index_select(0, order) * 2).contiguous();
    std::string c = tg::inspect({x}).c_source;
    CHECK_EQ(kernels(x), 3);
    CHECK_EQ(th::count_of(c, "__attribute__((noinline)) void k"), 1);
    CHECK_EQ(th::count_of(c, "runs k0's code"), 2);
    CHECK_ALL_NEAR(x.to_vector<double>(), (std::vector<double>{24, 32, 40, 0, 8, 16, 72, 80, 88,
                                                                48, 56, 64}), 0);
    Tensor y = Tensor::ones({4, 3});   // a bad index in the second step still names its call
    Tensor bad = Tensor::from_vector(std::vector<int64_t>{1, 0, 4, 2});
    for (int step = 0; step < 3; step++)
        y = (y.index_select(0, step == 1 ? bad : order) * 2).contiguous();
    CHECK_THROWS(y.to_vector(), "index_select: index out of range [0, 4)", "test_schedule.cpp");
}

// An embedding read by a matrix product (the model of 04_makemore evaluated on many rows) is
// stored: inlined into the product, its bounds-checked lookups kept the product out of tiles.
TEST(embedding_read_by_a_product_is_stored_and_the_product_tiled) {
    std::vector<int32_t> ids(256 * 3);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = int32_t(i * 7 % 27);
    Tensor C = data({27, 10}), W = data({200, 30});
    Tensor h = C[Tensor::from_vector(ids, {256, 3})].reshape({256, 30}).matmul(W.t());
    tg::Stages st = tg::inspect({h});
    CHECK(st.schedule.find("GATHER float32 [768,10]") != std::string::npos);
    CHECK_EQ(kernels(h), 2);
    CHECK(st.c_source.find("a matrix product in tiles") != std::string::npos);
    std::vector<float> got = h.to_vector();   // against the product of the gathered rows
    std::vector<float> cv = C.to_vector(), wv = W.to_vector();
    for (int r = 0; r < 256; r += 37)
        for (int j = 0; j < 200; j += 23) {
            double want = 0;
            for (int k = 0; k < 30; k++)
                want += double(cv[size_t(ids[size_t(r * 3 + k / 10)] * 10 + k % 10)]) *
                        wv[size_t(j * 30 + k)];
            CHECK_NEAR(got[size_t(r * 200 + j)], want, 1e-4);
        }
}

// A reduction broadcast back over the rows it reduced runs inside the row loop, before the loop
// over the row: softmax, log_softmax and LayerNorm are one kernel with no temporary. Broadcast
// back over an outer axis it would be computed again for every row: it gets a buffer.
TEST(reductions_broadcast_back_run_inside_the_row_loop) {
    Tensor x = data({4, 10});
    CHECK_EQ(kernels(x.softmax(1)), 1);   // row max, row sum of e^(x - max), the quotient
    CHECK_EQ(temps(x.softmax(1)), 0);
    CHECK_EQ(kernels(x.log_softmax(-1)), 1);
    CHECK_EQ(kernels(x - x.mean(1, true)), 1);
    Tensor w = data({10}), b = data({10});
    Tensor centered = x - x.mean(-1, true);   // LayerNorm without its leaves
    CHECK_EQ(kernels(centered * ((centered * centered).mean(-1, true) + 1e-5f).rsqrt() * w + b), 1);
    // over axis 0: the max, e^(x - max) (read by two kernels) and its sum are stored
    CHECK_EQ(kernels(x.softmax(0)), 4);
    CHECK_EQ(kernels(x.sum(1)), 1);
    CHECK_EQ(kernels(x.sum(1) * 2.0f + 1.0f), 1);
    CHECK_EQ(kernels(x.sum(1).sum(0)), 1);   // a reduction nested in a reduction
    std::vector<float> sm = x.softmax(1).to_vector();
    float row = 0;
    for (int j = 0; j < 10; j++) row += sm[size_t(j)];
    CHECK_NEAR(row, 1.0, 1e-6);
}

TEST(views_compose_to_strides) {
    Tensor x = data({6, 4});
    std::string ir = tg::inspect({x.transpose(0, 1).flip(0) + 1.0f}).optimized_ir;
    CHECK(ir.find("buf1[(i0*-1 + i1*4 + 3)]") != std::string::npos);
    ir = tg::inspect({x.reshape({24}).reshape({4, 6}) * 2.0f}).optimized_ir;
    CHECK(ir.find("buf1[(i0*6 + i1)]") != std::string::npos);
}

// A value read by several kernels, or at several indices, is computed again where it is read
// when that costs little (e^x: about 9 cycles an element), and stored once when it does not.
TEST(shared_computation_is_recomputed_when_cheap) {
    Tensor x = data({5, 5});
    Tensor e = x.exp();
    CHECK_EQ(kernels(e.sum(0) + e.sum(1)), 1);   // both sums in the one loop over i
    Tensor costly = x.exp().exp().exp();
    CHECK_EQ(kernels(costly.sum(0) + costly.sum(1)), 2);   // costly stored, then both sums
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

// The emitted C, character for character, for a reduction with fused producer and consumer
// (relu is where(x <= 0, 0, x): x is computed once and read three times).
TEST(golden_c_for_matvec_relu) {
    tg::Loc here = tg::Loc::here("golden.cpp", 7);
    Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor b = Tensor::from_vector(std::vector<float>{1, 2, 3});
    Tensor y = (tg::Operand(a, here) * b).sum(1, false, here).relu(here);
    std::string want =
        "/* generated by tinygrad.hpp */\n"
        "#include <math.h>\n"
        "#include <stdint.h>\n"
        "typedef void (*tg_chunk)(void *const *b, int64_t *err, int64_t lo, int64_t hi);\n"
        "typedef void (*tg_run_chunks)(tg_chunk f, void *const *b, int64_t *err, int64_t n,\n"
        "                              int64_t chunks);\n"
        "static inline float tg_wheref(int c, float a, float b) {\n"
        "    union { float f; uint32_t u; } x = {a}, y = {b};\n"
        "    uint32_t m = -(uint32_t)(c != 0);\n"
        "    x.u = (x.u & m) | (y.u & ~m);\n"
        "    return x.f;\n"
        "}\n"
        "\n"
        "/* K0 forward float32 [2]: CMPEQ MUL REDUCE_SUM CMPLT MAX WHERE\n"
        "   from golden.cpp:7 */\n"
        "static __attribute__((noinline)) void k0(const float *restrict buf1, const float *restrict buf2, float *restrict buf0) {\n"
        "    for (int64_t i0 = 0; i0 < 2; i0++) {\n"
        "        float acc0 = 0.0f;\n"
        "        for (int64_t i1 = 0; i1 < 3; i1++) {\n"
        "            acc0 = fmaf(buf1[((i0 * 3) + i1)], buf2[i1], acc0);\n"
        "        }\n"
        "        buf0[i0] = tg_wheref(((acc0 < 0.0f) | (acc0 == 0.0f)), 0.0f, acc0);\n"
        "    }\n"
        "}\n"
        "\n"
        "void tg_program(void *const *b, int64_t *err, tg_run_chunks run_chunks) {\n"
        "    (void)b; (void)err; (void)run_chunks;\n"
        "    k0((const float *)b[1], (const float *)b[2], (float *)b[0]);\n"
        "}\n";
    CHECK_EQ(tg::inspect({y}).c_source, want);
    CHECK_ALL_NEAR(y.to_vector(), (std::vector<double>{14, 32}), 0);
}

// assign writes into the target's own buffer; readers of the old value run first, and a value
// that reads the target through a view is computed into a temporary before the write.
TEST(assign_writes_in_place_and_orders_readers) {
    Tensor p = Tensor::from_vector(std::vector<float>{1, 2, 3, 4});
    Tensor alias = p.reshape({2, 2});                  // a view: sees the write only in place
    Tensor old_sum = p.sum();                          // reads p before the update
    tg::realize({p.assign(p * 2.0f + 1.0f), old_sum});
    CHECK_EQ(p.to_vector(), (std::vector<float>{3, 5, 7, 9}));
    CHECK_EQ(alias.to_vector(), (std::vector<float>{3, 5, 7, 9}));   // realized after the write
    CHECK_EQ(old_sum.item(), 10.0);
    p.assign(p.flip(0)).realize();                     // reads other elements than it writes
    CHECK_EQ(p.to_vector(), (std::vector<float>{9, 7, 5, 3}));
    p.assign(p - p.max()).realize();                   // a reduction of the target itself
    CHECK_EQ(p.to_vector(), (std::vector<float>{0, -2, -4, -6}));
    Tensor m = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    m.assign(m.transpose(0, 1).reshape({2, 3})).realize();
    CHECK_EQ(m.to_vector(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
    CHECK_THROWS(p.assign(Tensor::zeros({3})), "assign", "[3]", "[4]");
}

// A bounds check that fails stops the program before it writes into existing buffers: an
// optimizer step with a bad embedding index leaves the parameters as they were. Run at once
// (INTERP, TG_SYNC=1) step() throws; in the background (CPU, TG_SYNC=0 and this small step
// let in by TG_BACKGROUND_MIN_WORK=0) the first read throws.
TEST(failed_bounds_check_skips_in_place_writes) {
    for (const char* device : {"CPU", "INTERP"})
        for (const char* sync : {"0", "1"}) {
            th::EnvGuard on("TG_DEVICE", device), mode("TG_SYNC", sync),
                small("TG_BACKGROUND_MIN_WORK", "0");
            Tensor table = Tensor::from_vector(std::vector<float>{1, 2, 3}).requires_grad();
            tg::optim::SGD opt({table}, 0.5);
            Tensor ids = Tensor::from_vector(std::vector<int32_t>{0, 5});   // 5 is out of range
            table[ids].sum().backward();
            if (std::string(device) == "CPU" && std::string(sync) == "0") {
                opt.step();
                CHECK_THROWS(table.to_vector(), "out of range", "got 5");
            } else {
                CHECK_THROWS(opt.step(), "out of range", "got 5");
            }
            CHECK_EQ(table.to_vector(), (std::vector<float>{1, 2, 3}));
        }
}

// Steps queued behind a failed one in the background do not run: they fail with its error,
// which the next wait throws once (here the third step(), which waits for the first); what
// they computed throws it whenever it is read.
TEST(steps_behind_a_failed_background_step_fail_with_it) {
    th::EnvGuard on("TG_DEVICE", "CPU"), mode("TG_SYNC", "0");
    th::EnvGuard small("TG_BACKGROUND_MIN_WORK", "0");
    Tensor table = Tensor::from_vector(std::vector<float>{1, 2, 3}).requires_grad();
    tg::optim::SGD opt({table}, 0.5);
    Tensor bad = Tensor::from_vector(std::vector<int32_t>{0, 5});
    Tensor good = Tensor::from_vector(std::vector<int32_t>{0, 1});
    Tensor first = table[bad].sum();
    first.backward();
    opt.step();                               // fails in the background
    opt.zero_grad();
    Tensor second = (table[good] * 2.0f).sum();
    second.backward();
    opt.step();                               // queued behind it
    opt.zero_grad();
    Tensor third = table[good].sum();
    third.backward();
    CHECK_THROWS(opt.step(), "out of range", "got 5");
    tg::synchronize();                        // thrown once
    CHECK(!third.realized());                 // the third step was not queued
    CHECK_THROWS(second.item(), "out of range", "got 5");
    CHECK_THROWS(second.item(), "out of range", "got 5");   // every read
    CHECK_THROWS(first.item(), "out of range", "got 5");
    CHECK_THROWS(tg::realize({second * 2.0f}), "out of range", "got 5");
    CHECK_EQ(table.to_vector(), (std::vector<float>{1, 2, 3}));   // neither step wrote
    opt.zero_grad();
    (table[good] * 2.0f).sum().backward();
    opt.step();                               // a step after the error runs
    CHECK_EQ(table.to_vector(), (std::vector<float>{0, 1, 3}));
}

// relu is where(x <= 0, 0, x) with x <= 0 = (x < 0) or (x == 0): logical ops on bools are
// recomputed where they are read, like comparisons, so neither relu nor its gradient stores one.
TEST(relu_condition_is_recomputed_not_stored) {
    Tensor x = data({8, 4}).requires_grad();
    Tensor y = x.relu();
    Tensor g = tg::gradients((y * y).sum(), {x})[0];
    std::string ir = tg::inspect({y, g}).loop_ir;
    CHECK_EQ(th::count_of(ir, "temp bool"), 0);
    CHECK_EQ(kernels(x.relu() * 2.0f), 1);
}

// relu's gradient tests relu's output, which passes x <= 0 as x does: a layer's pre-activation
// (a matrix product) is read by relu alone and computed inside its kernel, never stored.
TEST(relu_gradient_tests_the_output_not_the_input) {
    Tensor x = data({8, 4}), w = (data({4, 6}) * 0.5f).requires_grad();
    Tensor h = x.matmul(w).relu();
    Tensor g = tg::gradients((h * h).sum(), {w})[0];
    std::string schedule = tg::inspect({h, g}).schedule;
    CHECK_EQ(th::count_of(schedule, "REDUCE_SUM"), 0);   // no kernel stores x·w
    CHECK_EQ(th::count_of(schedule, "reduction read by 2+ kernels"), 0);
    // dL/dw = xᵀ (2h ⊙ [h > 0]) = xᵀ 2h
    std::vector<float> xv = x.to_vector(), hv = h.to_vector(), gv = g.to_vector();
    for (size_t k = 0; k < 4; k++)
        for (size_t j = 0; j < 6; j++) {
            double want = 0;
            for (size_t i = 0; i < 8; i++) want += double(xv[i * 4 + k]) * 2 * hv[i * 6 + j];
            CHECK_NEAR(gv[k * 6 + j], want, 1e-5);
        }
}

// The gradient of a gather that picks one element per row (cross-entropy's label) is a select
// fused into the softmax gradient's kernel, not a scatter into zeros of its own.
TEST(label_pick_gradient_is_a_select_not_a_scatter) {
    Tensor x = data({8, 5}).requires_grad();
    Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 4, 2, 2, 1, 3, 0, 4});
    Tensor g = tg::gradients(tg::nn::cross_entropy(x, labels), {x})[0];
    std::string schedule = tg::inspect({g}).schedule;
    CHECK_EQ(th::count_of(schedule, "SCATTER_ADD"), 0);
    CHECK_EQ(th::count_of(tg::inspect({g}).optimized_ir, "\nK"), 1);
    // a picked logit's gradient is (softmax - 1)/8, the others softmax/8
    std::vector<float> xv = x.to_vector(), gv = g.to_vector();
    for (size_t r = 0; r < 8; r++) {
        double sum = 0;
        for (size_t c = 0; c < 5; c++) sum += std::exp(double(xv[r * 5 + c]));
        for (size_t c = 0; c < 5; c++) {
            double p = std::exp(double(xv[r * 5 + c])) / sum;
            bool picked = int32_t(c) == std::vector<int32_t>{0, 4, 2, 2, 1, 3, 0, 4}[r];
            CHECK_NEAR(gv[r * 5 + c], (p - (picked ? 1 : 0)) / 8, 1e-6);
        }
    }
}

// softmax and log_softmax subtract the row max only to keep e^ in range: the max is detached,
// so their gradients hold no comparison with it (x == max x) and no count of its ties, and are
// still exact where a row's maximum is tied.
TEST(softmax_gradients_leave_out_the_max) {
    Tensor x = Tensor::from_vector(std::vector<float>{1, 3, 3, 0, -2, 0.5f, 0.5f, 0.5f}, {2, 4})
                   .requires_grad();
    Tensor w = data({2, 4});
    std::vector<float> xv = x.to_vector(), wv = w.to_vector();
    for (bool log : {false, true}) {
        Tensor g = tg::gradients(((log ? x.log_softmax(1) : x.softmax(1)) * w).sum(), {x})[0];
        CHECK_EQ(th::count_of(tg::inspect({g}).graph, "CMPEQ"), 0);
        std::vector<float> gv = g.to_vector();
        for (size_t r = 0; r < 2; r++) {
            double sum = 0, sw = 0, ws = 0;
            for (size_t c = 0; c < 4; c++) sum += std::exp(double(xv[r * 4 + c]));
            for (size_t c = 0; c < 4; c++) {
                sw += std::exp(double(xv[r * 4 + c])) / sum * wv[r * 4 + c];
                ws += wv[r * 4 + c];
            }
            for (size_t c = 0; c < 4; c++) {   // s (w - Σ s w); for log_softmax, w - s Σ w
                double p = std::exp(double(xv[r * 4 + c])) / sum, wc = wv[r * 4 + c];
                CHECK_NEAR(gv[r * 4 + c], log ? wc - p * ws : p * (wc - sw), 1e-6);
            }
        }
    }
}

// Ops on constants fold as the graph is built: the gradient of a mean is one constant node,
// with no kernel computing 1/n (reductions of constants are not folded: their loops round).
TEST(constant_subgraphs_fold_when_built) {
    Tensor c = (Tensor::full({3}, 2.0f) * 3.0f + 1.0f).reshape({3, 1}).expand({3, 4});
    std::string graph = tg::inspect({c}).graph;
    CHECK_EQ(th::count_of(graph, "\n"), 1);   // one node
    CHECK(graph.find("CONST 7") != std::string::npos);
    Tensor x = data({4, 8}).requires_grad();
    Tensor g = tg::gradients(x.mean(), {x})[0];
    CHECK_EQ(th::count_of(tg::inspect({g}).graph, "\n"), 1);
    CHECK_EQ(g.to_vector()[5], 1.0f / 32);
    CHECK_EQ(th::count_of(tg::inspect({Tensor::ones({4}).sum()}).graph, "REDUCE_SUM"), 1);
    Tensor leaf = Tensor::zeros({2}).requires_grad();   // a leaf is not a plain constant
    CHECK_EQ(th::count_of(tg::inspect({leaf * 2.0f}).graph, "MUL"), 1);
}

// DESIGN.md's worked example (examples/02_pipeline.cpp): the product's reduction runs inside the
// loop of the row sum, so the whole expression is one nest with no temporary.
TEST(design_worked_example_is_one_nest_without_temporaries) {
    Tensor a = data({64, 32}), b = data({32, 16});
    Tensor c = (a.matmul(b) + 1.0f).relu().sum(1);
    tg::Stages st = tg::inspect({c});
    CHECK_EQ(th::count_of("\n" + st.optimized_ir, "\nK"), 1);
    CHECK_EQ(th::count_of(st.optimized_ir, ": temp "), 0);
    std::vector<float> av = a.to_vector(), bv = b.to_vector(), got = c.to_vector();
    for (size_t i = 0; i < 64; i++) {
        double row = 0;
        for (size_t j = 0; j < 16; j++) {
            double dot = 0;
            for (size_t k = 0; k < 32; k++) dot += double(av[i * 32 + k]) * bv[k * 16 + j];
            row += std::max(dot + 1, 0.0);
        }
        CHECK_NEAR(got[i], row, 1e-4 * (1 + std::fabs(row)));
    }
}

// An activation with its gradient: the plain arithmetic of tanh's pieces (1 - e, 1 / (1 + e))
// is recomputed in the backward kernel; only the parts the C computes by a call or a select
// (the sign, e^-2|x|) are stored once for both kernels. relu stores nothing but its outputs.
TEST(activation_gradients_store_only_their_calls) {
    Tensor x = data({4, 10}).requires_grad(), w = data({4, 10});
    auto count = [&](const Tensor& y) {
        Tensor g = tg::gradients((y * w).sum(), {x})[0];
        return kernels_of({y, g});
    };
    CHECK_EQ(count(x.tanh()), 4);      // sign, exponential, tanh, gradient
    CHECK_EQ(count(x.sigmoid()), 4);
    CHECK_EQ(count(x.relu()), 2);      // relu and its gradient, nothing stored between
}

// Values that a matrix product reads through a broadcast must be computed once per value,
// which its loops cannot do: lowering asks to store them, and now only the outermost of them,
// whose own kernel computes the parts. Through a GELU between two products: the GELU (not its
// tanh's parts) for the second product; the first's input gradient, a sum of five terms (not
// the terms, nor the gradient product they scale), for its weight's and its input's gradient.
// Base: 9 tensors of [64, 128], 8 stored for lowering.
TEST(product_gradient_through_gelu_stores_the_sum_not_its_parts) {
    Tensor x = data({64, 32}).requires_grad(), w1 = data({32, 128}).requires_grad();
    Tensor w2 = data({128, 32});
    Tensor y = (x.matmul(w1) * 0.01f).gelu(true).matmul(w2);
    std::vector<Tensor> g = tg::gradients((y * y).sum(), {x, w1});
    std::string sched = tg::inspect({y, g[0], g[1]}).schedule;
    // z = 0.01 x w1 (in place of the sum under it), the GELU, and z's gradient (read by both
    // its products; it takes the place of the product of y's gradient under it); on the CPU
    // (calls and selects stay out of a product's epilogue) the tanh, its sign and e^-2|z| are
    // stored too, for both passes
    CHECK_EQ(th::count_of(sched, "float32 [64,128]"), 6);
    CHECK_EQ(th::count_of(sched, "REDUCE_SUM"), 0);
    // the GELU and the sum
    CHECK_EQ(th::count_of(sched, "(not computable once per value inside)"), 2);
}

// A costly value read at i / 2 (each element by two consecutive iterations: a nearest 2x
// upsampling; a max pool's gradient read from its windows) would be computed twice over
// inside its reader's loops: lowering asks to store it, and its kernel computes it once.
TEST(value_read_at_a_divided_index_is_stored) {
    Tensor a = data({4, 8, 8}), b = data({4, 8, 8});
    Tensor costly = (a * 0.1f).exp() + (b * 0.2f).sin();
    Tensor up = costly.reshape({4, 8, 1, 8, 1}).expand({4, 8, 2, 8, 2}).reshape({4, 16, 16});
    Tensor y = up * data({4, 16, 16});
    std::string sched = tg::inspect({y}).schedule;
    CHECK_EQ(kernels(y), 2);
    CHECK_EQ(th::count_of(sched, "(not computable once per value inside)"), 1);
    std::vector<float> got = y.to_vector(), small = costly.to_vector();
    std::vector<float> other = data({4, 16, 16}).to_vector();
    std::vector<float> want(got.size());
    for (size_t i = 0; i < want.size(); i++) {
        size_t n = i / 256, r = i / 16 % 16, c = i % 16;
        want[i] = small[n * 64 + r / 2 * 8 + c / 2] * other[i];
    }
    CHECK_ALL_NEAR(got, want, 1e-6);
}

// A Linear's x Wᵀ + b read by several products (attention's q, k and v: slices of one
// Linear's output, read by the forward and backward products) is stored with its + b, by the
// product's kernel (in place of x Wᵀ, which only it reads), rather than x Wᵀ stored and + b
// added to the operands in every reader: as many tensors stored, and each reader's tiles
// plain loads (for CUDA, NVRTC 13 gave attention's scores product 145 registers with the
// additions, 127 without).
TEST(bias_read_by_several_products_is_stored_in_place_of_the_product) {
    Tensor x = data({16, 8}), w = (data({8, 24}) * 0.1f).requires_grad();
    Tensor b = (data({24}) * 0.1f).requires_grad();
    Tensor h = x.matmul(w) + b;
    Tensor q = h.slice(1, 0, 8), k = h.slice(1, 8, 16), v = h.slice(1, 16, 24);
    Tensor y = q.matmul(k.transpose(0, 1)).softmax(-1).matmul(v);
    // h's line of a schedule
    auto h_stored = [](const std::string& sched) {
        size_t at = sched.find("ADD float32 [16,24]");
        return at == std::string::npos ? std::string()
                                       : sched.substr(at, sched.find('\n', at) - at);
    };
    std::string forward = tg::inspect({y}).schedule;
    CHECK_EQ(th::count_of(h_stored(forward), "(in place of the reduction it alone reads)"), 1);
    CHECK_EQ(th::count_of(forward, "REDUCE_SUM float32 [16,1,24]"), 0);
    std::vector<Tensor> g = tg::gradients((y * y).sum(), {w, b});
    std::string step = tg::inspect({y, g[0], g[1]}).schedule;
    CHECK_EQ(th::count_of(h_stored(step), "(in place of the reduction it alone reads)"), 1);
    CHECK_EQ(th::count_of(step, "REDUCE_SUM float32 [16,1,24]"), 0);
    // the same values as with h computed first
    Tensor h2 = (x.matmul(w) + b).realize();
    Tensor y2 = h2.slice(1, 0, 8).matmul(h2.slice(1, 8, 16).transpose(0, 1)).softmax(-1)
                    .matmul(h2.slice(1, 16, 24));
    std::vector<float> want = y2.to_vector();
    CHECK_ALL_NEAR(y.to_vector(), std::vector<double>(want.begin(), want.end()), 1e-5);
}

// A value that reads a reduction at two indices (the gradient of a tensor cut twice from a
// cat: its two slices of the cat's gradient, summed) is not stored in place of it: the
// reduction could not be computed once per value inside (planning went round forever).
TEST(reduction_read_at_two_indices_is_not_stored_in_place_of_its_reader) {
    Tensor a = Tensor::randn({1, 4}, 1), b = Tensor::randn({1, 4}, 2).requires_grad();
    Tensor c = Tensor::randn({3, 4, 12}, 3), w = Tensor::randn({3, 4, 12}, 4);
    Tensor joined = tg::cat({a.cos(), b, b}, 1);
    Tensor loss = (joined.maximum(c) * w).sum();
    loss.backward();
    std::string sched = tg::inspect({loss, b.grad()}).schedule;
    CHECK_EQ(th::count_of(sched, "REDUCE_SUM float32 [1,1,12]"), 1);
    // d loss / d joined[j] = the sum of w where joined wins; b is columns 4-7 and 8-11
    std::vector<float> jv = joined.to_vector(), cv = c.to_vector(), wv = w.to_vector();
    std::vector<double> want(4, 0.0);
    for (size_t r = 0; r < 12; r++)
        for (size_t j = 4; j < 12; j++)
            if (jv[j] > cv[r * 12 + j]) want[j % 4] += wv[r * 12 + j];
    CHECK_ALL_NEAR(b.grad().to_vector(), want, 1e-5);
}

// W2 of the benchmarks (Bengio's character MLP: embedding, two tanh layers, cross-entropy,
// SGD) as one jitted step: 15 nests after the passes, from 33 as lowered (the rows that
// x[rows] wraps from the end, read by the lookup and its gradient). Its 9 matrix
// products (3 forward, 3 input gradients, 3 weight gradients) are tiled nests of their own,
// each with its elementwise consumer as the epilogue: the tanh of both hidden layers, and each
// weight's update with its gradient. The batch's two index gathers share a nest with the count
// of targets that cross-entropy does not ignore (its mean divides by it); the gradient of the
// label's pick is a select (no scatter of its own), scaled by that count, in a nest of its
// own; softmax, cross-entropy and the rest of their gradient share one row loop, and the loss
// is summed after that loop; the optimizer's step count is counted after the embedding's
// update.
TEST_ON_CPU(bengio_training_step_is_fifteen_nests_nine_of_them_tiled) {
    const int V = 27, T = 3, E = 10, D = 200, B = 32, pool = 64;
    std::vector<int32_t> xs(size_t(pool) * T), ys(pool);
    for (size_t i = 0; i < xs.size(); i++) xs[i] = int32_t(i * 7 % V);
    for (size_t i = 0; i < ys.size(); i++) ys[i] = int32_t(i * 5 % V);
    Tensor X = Tensor::from_vector(xs, {pool, T}), Y = Tensor::from_vector(ys, {pool});
    tg::manual_seed(3);
    Tensor C = Tensor::randn({V, E}).requires_grad();
    namespace nn = tg::nn;
    nn::Sequential mlp(nn::Linear(T * E, D, false), nn::Tanh(), nn::Linear(D, D, false),
                       nn::Tanh(), nn::Linear(D, V, false));
    std::vector<Tensor> params = mlp.parameters();
    params.push_back(C);
    tg::optim::SGD opt(params, 0.01);
    tg::Jit step([&](const std::vector<Tensor>& in) {
        Tensor loss = nn::cross_entropy(mlp(C[X[in[0]]].reshape({B, T * E})), Y[in[0]]);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
    std::vector<int32_t> batch(B);
    for (int i = 0; i < B; i++) batch[size_t(i)] = (i * 3) % pool;
    double first = step({Tensor::from_vector(batch)}).item();
    CHECK_EQ(tg::last_program().nests, 15);
    CHECK_EQ(tg::last_program().nests_lowered, 33);
    CHECK_EQ(tg::last_program().tiled_nests, 9);
    double second = step({Tensor::from_vector(batch)}).item();
    CHECK(second < first);   // it trains
}

// The gradient of slices of a product (attention's q, k, v) is the sum of the slices'
// gradients padded back: each is a product of its own, stored, not computed inside the sum,
// where it would run over the other slices' columns too.
TEST(reduction_read_through_a_pad_is_stored) {
    Tensor x = data({6, 5}), w = (data({5, 8}) * 0.1f).requires_grad();
    Tensor a = data({4, 3}) * 0.2f, b = data({4, 2}) * 0.3f;
    Tensor h = x.matmul(w), q = h.slice(1, 0, 4), k = h.slice(1, 4, 8);
    Tensor yq = q.matmul(a), yk = k.matmul(b);
    Tensor gw = tg::gradients((yq * yq).sum() + (yk * yk).sum(), {w})[0];
    CHECK_EQ(th::count_of(tg::inspect({gw}).schedule, "(reduction read through a pad)"), 2);
    // the same gradient by hand: dL/dq = 2 yq aᵀ, dL/dk = 2 yk bᵀ, dL/dw = xᵀ [dq dk]
    Tensor dq = (yq * 2.0f).matmul(a.transpose(0, 1)), dk = (yk * 2.0f).matmul(b.transpose(0, 1));
    Tensor want = x.transpose(0, 1).matmul(tg::cat({dq, dk}, 1));
    std::vector<float> got_v = gw.to_vector(), want_v = want.to_vector();
    std::vector<double> want_d(want_v.begin(), want_v.end());
    CHECK_ALL_NEAR(got_v, want_d, 1e-4);
}

// Each step reads the one before several times (through %, whose composition reshapes its
// operands to their common shape): one kernel whose code grows with the steps, not with a
// power of them (lowering finds an earlier value again only where its index expressions are
// the same objects, and a reshape to the same shape made new ones: such a chain with y / 2
// took over a minute of C compiling at 6 steps)
TEST(value_read_several_times_through_same_shape_reshapes_is_lowered_once) {
    auto chain = [](int steps) {
        Tensor y = Tensor::from_vector(std::vector<int64_t>{7, 12, 100, 27});
        for (int k = 0; k < steps; k++) y = tg::where(y % 2 == 0, y.floor_divide(2), y * 3 + 1);
        return y;
    };
    size_t four = tg::inspect({chain(4)}).c_source.size();
    CHECK(four < 20000);
    if (four >= 20000) return;   // 8 steps could take minutes
    size_t eight = tg::inspect({chain(8)}).c_source.size();
    CHECK(eight < 2 * four);     // linear in the steps: 4 more add a little
    CHECK_EQ(kernels(chain(8)), 1);
    std::vector<int64_t> want{7, 12, 100, 27};
    for (int k = 0; k < 40; k++)
        for (int64_t& v : want) v = v % 2 == 0 ? v / 2 : v * 3 + 1;
    CHECK(chain(40).to_vector<int64_t>() == want);
}

// split_divided looks for integer divisions of a loop's variable by a constant: a float
// division by one (x / 1e200, whose divisor no int64 holds) is not among them
TEST(float_division_by_a_huge_constant_is_no_loop_divisor) {
    std::vector<double> v(64);
    for (size_t i = 0; i < v.size(); i++) v[i] = double(i) * 1e190;
    Tensor x = Tensor::from_vector(v, {8, 8});
    std::vector<double> y = (x / 1e200 + x.sum(1, true) / 2.0).to_vector<double>();
    for (size_t i = 0; i < y.size(); i++) {
        double row = 0;
        for (size_t j = i / 8 * 8; j < i / 8 * 8 + 8; j++) row += v[j];
        CHECK_NEAR(y[i], v[i] / 1e200 + row / 2, 1e-12 * std::fabs(row));
    }
}
