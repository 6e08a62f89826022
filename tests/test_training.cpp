// Training: nn layers and initialisers, losses, optimizers, the jit, data, plots and
// safetensors. Every numeric result is compared with a reference computed here by plain loops
// in double precision; the jit is compared bit for bit with the same steps run eagerly; the
// safetensors files are checked byte by byte against the format's specification.
#include "harness.hpp"
#include "reference.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <unistd.h>

using tg::DType;
using tg::Shape;
using tg::Tensor;
namespace nn = tg::nn;
namespace optim = tg::optim;

namespace {
using th::Lcg;
using th::randd;
using th::randf;
using th::randi;

using Vec = std::vector<double>;
const double F32 = 1e-5;   // float32 results against double references

// ---- helpers (deterministic inputs: th::randf/randd/randi) ---------------------------------
template <typename T> Vec D(const std::vector<T>& v) { return Vec(v.begin(), v.end()); }
Vec vals(const Tensor& t) { return t.to_vector<double>(); }
Tensor fv(const std::vector<float>& v, const Shape& s = {-1}) { return Tensor::from_vector(v, s); }

// y[r, o] = sum_i x[r, i] W[o, i] + b[o]   (x [rows, in], W [out, in])
Vec linear_ref(const Vec& x, const Vec& W, const Vec& b, int64_t rows, int64_t in, int64_t out) {
    Vec y(size_t(rows * out));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            double acc = b.empty() ? 0 : b[size_t(o)];
            for (int64_t i = 0; i < in; i++) acc += x[size_t(r * in + i)] * W[size_t(o * in + i)];
            y[size_t(r * out + o)] = acc;
        }
    return y;
}

struct Moments { double mean, sd, min, max; };
Moments moments(const Vec& v) {
    double s = 0, mn = v[0], mx = v[0];
    for (double x : v) s += x, mn = std::min(mn, x), mx = std::max(mx, x);
    double mean = s / double(v.size()), ss = 0;
    for (double x : v) ss += (x - mean) * (x - mean);
    return {mean, std::sqrt(ss / double(v.size())), mn, mx};
}

bool same_node(const Tensor& a, const Tensor& b) { return a.node().get() == b.node().get(); }

// ---- files ------------------------------------------------------------------------------------

std::vector<std::string> dir_entries(const std::string& dir);
// a fresh directory under /tmp, removed with its files at the end of the scope
struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/tg-training-XXXXXX";
        path = mkdtemp(tmpl) ? std::string(tmpl) : std::string("/tmp");
    }
    ~TempDir() {
        if (path == "/tmp") return;
        for (const std::string& n : dir_entries(path)) std::remove((path + "/" + n).c_str());
        rmdir(path.c_str());
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
};
std::vector<std::string> dir_entries(const std::string& dir) {
    std::vector<std::string> out;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) {
            std::string n = e->d_name;
            if (n != "." && n != "..") out.push_back(n);
        }
        closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
}
std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
std::string le64(uint64_t n) {
    std::string s(8, '\0');
    for (int b = 0; b < 8; b++) s[size_t(b)] = char((n >> (8 * b)) & 0xff);
    return s;
}
std::string le_f32(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    std::string s(4, '\0');
    for (int b = 0; b < 4; b++) s[size_t(b)] = char((bits >> (8 * b)) & 0xff);
    return s;
}
std::string le_f64(double f) {
    uint64_t bits;
    std::memcpy(&bits, &f, 8);
    std::string s(8, '\0');
    for (int b = 0; b < 8; b++) s[size_t(b)] = char((bits >> (8 * b)) & 0xff);
    return s;
}
std::string le_i32(int32_t v) {
    uint32_t bits = uint32_t(v);
    std::string s(4, '\0');
    for (int b = 0; b < 4; b++) s[size_t(b)] = char((bits >> (8 * b)) & 0xff);
    return s;
}
// a safetensors file: the header's length, the header, the data
std::string st_file(const std::string& header, const std::string& data) {
    return le64(header.size()) + header + data;
}

// ---- a small, strict JSON reader (RFC 8259), independent of the library's -------------------

struct Json {
    char kind = 'n';   // o(bject) a(rray) s(tring) d (number) t f n
    std::vector<std::pair<std::string, Json>> members;
    std::vector<Json> items;
    std::string text;
    double number = 0;
    const Json* at(const std::string& key) const {
        for (auto& kv : members)
            if (kv.first == key) return &kv.second;
        return nullptr;
    }
};
struct JsonReader {
    const std::string& s;
    size_t i = 0;
    void ws() { while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++; }
    bool lit(const char* w) {
        size_t n = std::strlen(w);
        if (s.compare(i, n, w) != 0) return false;
        i += n;
        return true;
    }
    bool str(std::string& out) {
        if (i >= s.size() || s[i] != '"') return false;
        i++;
        while (i < s.size() && s[i] != '"') {
            if ((unsigned char)s[i] < 0x20) return false;
            if (s[i] == '\\') {
                if (++i >= s.size()) return false;
                char e = s[i];
                if (e == 'u') {
                    if (i + 4 >= s.size()) return false;
                    for (int k = 1; k <= 4; k++)
                        if (!std::isxdigit((unsigned char)s[i + size_t(k)])) return false;
                    out += '?';
                    i += 4;
                } else if (std::strchr("\"\\/bfnrt", e) && e) {
                    out += e;
                } else {
                    return false;
                }
                i++;
                continue;
            }
            out += s[i++];
        }
        if (i >= s.size()) return false;
        i++;
        return true;
    }
    bool num(double& out) {
        size_t start = i;
        if (i < s.size() && s[i] == '-') i++;
        if (i >= s.size() || !std::isdigit((unsigned char)s[i])) return false;
        if (s[i] == '0') i++;
        else while (i < s.size() && std::isdigit((unsigned char)s[i])) i++;
        if (i < s.size() && s[i] == '.') {
            i++;
            if (i >= s.size() || !std::isdigit((unsigned char)s[i])) return false;
            while (i < s.size() && std::isdigit((unsigned char)s[i])) i++;
        }
        if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
            i++;
            if (i < s.size() && (s[i] == '+' || s[i] == '-')) i++;
            if (i >= s.size() || !std::isdigit((unsigned char)s[i])) return false;
            while (i < s.size() && std::isdigit((unsigned char)s[i])) i++;
        }
        out = std::strtod(s.substr(start, i - start).c_str(), nullptr);
        return true;
    }
    bool value(Json& v, int depth = 0) {
        if (depth > 32) return false;
        ws();
        if (i >= s.size()) return false;
        if (s[i] == '{') {
            v.kind = 'o';
            i++;
            ws();
            if (i < s.size() && s[i] == '}') { i++; return true; }
            while (true) {
                ws();
                std::string key;
                if (!str(key)) return false;
                ws();
                if (i >= s.size() || s[i] != ':') return false;
                i++;
                Json member;
                if (!value(member, depth + 1)) return false;
                v.members.push_back({key, member});
                ws();
                if (i < s.size() && s[i] == ',') { i++; continue; }
                if (i < s.size() && s[i] == '}') { i++; return true; }
                return false;
            }
        }
        if (s[i] == '[') {
            v.kind = 'a';
            i++;
            ws();
            if (i < s.size() && s[i] == ']') { i++; return true; }
            while (true) {
                Json item;
                if (!value(item, depth + 1)) return false;
                v.items.push_back(item);
                ws();
                if (i < s.size() && s[i] == ',') { i++; continue; }
                if (i < s.size() && s[i] == ']') { i++; return true; }
                return false;
            }
        }
        if (s[i] == '"') { v.kind = 's'; return str(v.text); }
        if (lit("true")) { v.kind = 't'; return true; }
        if (lit("false")) { v.kind = 'f'; return true; }
        if (lit("null")) { v.kind = 'n'; return true; }
        v.kind = 'd';
        return num(v.number);
    }
};
// the whole text is one JSON value (whitespace around it allowed)
bool parse_json(const std::string& text, Json& out) {
    JsonReader r{text};
    if (!r.value(out)) return false;
    r.ws();
    return r.i == text.size();
}
std::vector<double> json_numbers(const Json* a) {
    std::vector<double> out;
    if (a && a->kind == 'a')
        for (const Json& x : a->items) out.push_back(x.kind == 'd' ? x.number : -1e300);
    return out;
}

}  // namespace

// =============================================================================================
// nn: layers and initialisers
// =============================================================================================

TEST(nn_linear_shapes_and_pytorch_init_range) {
    tg::manual_seed(101);
    nn::Linear small(50, 7);
    CHECK_EQ(small.in_features, int64_t(50));
    CHECK_EQ(small.out_features, int64_t(7));
    CHECK_EQ(small.weight.shape(), (Shape{7, 50}));
    CHECK_EQ(small.bias.shape(), (Shape{7}));
    CHECK(small.weight.dtype() == DType::FLOAT32);
    CHECK(small.weight.tracks_grad() && small.bias.tracks_grad());
    CHECK(!small.weight.realized());   // computed with the next program
    tg::realize({small.weight * 1.0f});
    CHECK(small.weight.realized() && small.bias.realized());
    std::vector<Tensor> ps = small.parameters();
    CHECK_EQ(ps.size(), size_t(2));
    if (ps.size() == 2) CHECK(same_node(ps[0], small.weight) && same_node(ps[1], small.bias));
    double b = 1 / std::sqrt(50.0);
    for (double x : vals(small.bias)) CHECK(x >= -b && x <= b);

    // 20000 weights: U(-1/√in, 1/√in) fills the range, sd = bound/√3, mean 0
    nn::Linear big(100, 200);
    double bound = 0.1;
    Moments m = moments(vals(big.weight));
    CHECK(m.min >= -bound && m.max <= bound);
    CHECK(m.max > 0.99 * bound && m.min < -0.99 * bound);
    CHECK_NEAR(m.sd, bound / std::sqrt(3.0), 0.03 * bound / std::sqrt(3.0));
    CHECK(std::fabs(m.mean) < 0.03 * m.sd);
    Moments mb = moments(vals(big.bias));
    CHECK(mb.min >= -bound && mb.max <= bound);
    CHECK(mb.max - mb.min > bound);   // 200 biases spread over the range
    CHECK(vals(big.weight) != vals(nn::Linear(100, 200).weight));   // fresh seeds each layer
}

TEST(nn_linear_forward_matches_loop) {
    tg::manual_seed(7);
    nn::Linear lin(5, 3);
    std::vector<float> xs = randf(4 * 5, 1, -2, 2);
    Tensor x = fv(xs, {4, 5});
    Tensor y = lin(x);
    CHECK_EQ(y.shape(), (Shape{4, 3}));
    Vec want = linear_ref(D(xs), vals(lin.weight), vals(lin.bias), 4, 5, 3);
    CHECK_ALL_NEAR(vals(y), want, F32);
    // leading batch axes are kept: [2,2,5] → [2,2,3], same rows
    Tensor y3 = lin(fv(xs, {2, 2, 5}));
    CHECK_EQ(y3.shape(), (Shape{2, 2, 3}));
    CHECK_ALL_NEAR(vals(y3), want, F32);
    CHECK_THROWS(lin(Tensor::zeros({4, 6})), "Linear", "[4,6]", "in_features 5");
}

TEST(nn_linear_deferred_learns_in_features) {
    tg::manual_seed(8);
    nn::Linear lin(4);
    CHECK(lin.parameters().empty());
    CHECK_EQ(lin.in_features, int64_t(-1));
    CHECK_EQ(lin.out_features, int64_t(4));
    std::vector<float> xs = randf(6 * 3, 2);
    Tensor y = lin(fv(xs, {6, 3}));
    CHECK_EQ(y.shape(), (Shape{6, 4}));
    CHECK_EQ(lin.in_features, int64_t(3));
    CHECK_EQ(lin.parameters().size(), size_t(2));
    CHECK_EQ(lin.weight.shape(), (Shape{4, 3}));
    CHECK_EQ(lin.bias.shape(), (Shape{4}));
    CHECK(lin.weight.tracks_grad() && lin.bias.tracks_grad());
    double b = 1 / std::sqrt(3.0);
    for (double w : vals(lin.weight)) CHECK(w >= -b && w <= b);
    CHECK_ALL_NEAR(vals(y), linear_ref(D(xs), vals(lin.weight), vals(lin.bias), 6, 3, 4), F32);
    // the width is fixed now
    Tensor w_before = lin.weight;
    CHECK_THROWS(lin(Tensor::zeros({2, 5})), "Linear", "in_features 3");
    CHECK(same_node(lin.weight, w_before));
    CHECK_THROWS(nn::Linear(0), "Linear");
    CHECK_THROWS(nn::Linear(3, 0), "Linear");
}

TEST(nn_linear_without_bias) {
    tg::manual_seed(9);
    nn::Linear lin(3, 2, false);
    std::vector<Tensor> ps = lin.parameters();
    CHECK_EQ(ps.size(), size_t(1));
    if (ps.size() == 1) CHECK(same_node(ps[0], lin.weight));
    CHECK(!lin.bias.defined());
    std::vector<float> xs = randf(5 * 3, 3);
    CHECK_ALL_NEAR(vals(lin(fv(xs, {5, 3}))), linear_ref(D(xs), vals(lin.weight), {}, 5, 3, 2), F32);
}

TEST(nn_embedding_picks_rows) {
    tg::manual_seed(10);
    nn::Embedding emb(10, 4);
    CHECK_EQ(emb.weight.shape(), (Shape{10, 4}));
    CHECK(emb.weight.tracks_grad());
    CHECK_EQ(emb.parameters().size(), size_t(1));
    std::vector<int32_t> ids = {3, 0, 9, 3, 7, 1};
    Tensor out = emb(Tensor::from_vector(ids, {2, 3}));
    CHECK_EQ(out.shape(), (Shape{2, 3, 4}));
    Vec W = vals(emb.weight), want;
    for (int32_t id : ids)
        for (int64_t d = 0; d < 4; d++) want.push_back(W[size_t(id * 4 + d)]);
    CHECK_ALL_NEAR(vals(out), want, 0);
    // randn initialisation: not all equal, roughly unit scale
    Moments m = moments(W);
    CHECK(m.sd > 0.3 && m.sd < 3);
}

TEST(nn_layernorm_normalizes_last_axis) {
    const int64_t rows = 5, dim = 8;
    std::vector<float> xs = randf(size_t(rows * dim), 4, -3, 5);
    for (size_t i = 0; i < xs.size(); i++) xs[i] = xs[i] * float(1 + i / size_t(dim)) + float(i / size_t(dim));
    nn::LayerNorm ln(dim);
    CHECK_EQ(ln.parameters().size(), size_t(2));
    Vec y = vals(ln(fv(xs, {rows, dim})));
    for (int64_t r = 0; r < rows; r++) {
        Vec row(y.begin() + r * dim, y.begin() + (r + 1) * dim);
        Moments m = moments(row);
        CHECK_NEAR(m.mean, 0, 1e-5);
        CHECK_NEAR(m.sd * m.sd, 1, 1e-3);
    }
    // with a weight and a bias, against (x - mean)/√(var + eps)·w + b over [2,5,8]
    std::vector<float> w = randf(size_t(dim), 5, 0.5, 2), bb = randf(size_t(dim), 6);
    nn::LayerNorm ln2(dim, 1e-3);
    ln2.weight = fv(w).requires_grad();
    ln2.bias = fv(bb).requires_grad();
    std::vector<float> x3 = randf(size_t(2 * rows * dim), 7, -1, 1);
    Tensor out = ln2(fv(x3, {2, rows, dim}));
    CHECK_EQ(out.shape(), (Shape{2, rows, dim}));
    Vec want;
    for (int64_t r = 0; r < 2 * rows; r++) {
        double mean = 0, var = 0;
        for (int64_t d = 0; d < dim; d++) mean += x3[size_t(r * dim + d)];
        mean /= double(dim);
        for (int64_t d = 0; d < dim; d++) var += (x3[size_t(r * dim + d)] - mean) * (x3[size_t(r * dim + d)] - mean);
        var /= double(dim);
        for (int64_t d = 0; d < dim; d++)
            want.push_back((x3[size_t(r * dim + d)] - mean) / std::sqrt(var + 1e-3) * w[size_t(d)] + bb[size_t(d)]);
    }
    CHECK_ALL_NEAR(vals(out), want, F32);
}

// padding_idx: that row starts as zeros and no gradient reaches it, the others' as usual
TEST(nn_embedding_padding_idx_keeps_its_row) {
    tg::manual_seed(11);
    nn::Embedding emb(5, 3, -1);   // the last row, 4
    CHECK(emb.padding_idx == std::optional<int64_t>(4));
    CHECK_ALL_NEAR(vals(emb.weight.slice(0, 4, 5)), (Vec{0, 0, 0}), 0);
    CHECK(moments(vals(emb.weight.slice(0, 0, 4))).sd > 0.3);
    Tensor ids = Tensor::from_vector(std::vector<int64_t>{4, 1, 4, 0, 1}, {5});
    Tensor scale = Tensor::from_vector(Vec{1, 2, 3, 4, 5}, {5, 1}).cast(DType::FLOAT32);
    (emb(ids) * scale).sum().backward();
    Vec g = vals(emb.weight.grad());   // row 1 from ids 1 and 4 (2 + 5), row 0 from id 3 (4)
    CHECK_ALL_NEAR(g, (Vec{4, 4, 4, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0}), 0);
    // functional, on rows that are not zero: the value stays, the gradient does not
    Tensor w = Tensor::from_vector(Vec{1, 2, 3, 4, 5, 6}, {3, 2}).cast(DType::FLOAT32).requires_grad();
    Tensor some = Tensor::from_vector(std::vector<int32_t>{0, 2, 0});
    Tensor picked = nn::functional::embedding(some, w, 0);
    CHECK_ALL_NEAR(vals(picked), (Vec{1, 2, 5, 6, 1, 2}), 0);
    picked.sum().backward();
    CHECK_ALL_NEAR(vals(w.grad()), (Vec{0, 0, 0, 0, 1, 1}), 0);
}

// LayerNorm over the last two axes, against the formula; without affine parameters, or bias
TEST(nn_layernorm_over_several_axes_and_without_affine) {
    std::vector<float> xs = randf(2 * 3 * 4, 40, -2, 3);
    Vec want_plain;
    for (int64_t n = 0; n < 2; n++) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < 12; i++) mean += xs[size_t(n * 12 + i)];
        mean /= 12;
        for (int64_t i = 0; i < 12; i++) var += std::pow(xs[size_t(n * 12 + i)] - mean, 2);
        var /= 12;
        for (int64_t i = 0; i < 12; i++)
            want_plain.push_back((xs[size_t(n * 12 + i)] - mean) / std::sqrt(var + 1e-5));
    }
    Tensor x = fv(xs, {2, 3, 4});
    nn::LayerNorm plain({3, 4}, 1e-5, false);
    CHECK(plain.named_parameters().empty());
    CHECK(plain.state_dict().empty());
    CHECK_ALL_NEAR(vals(plain(x)), want_plain, F32);
    nn::LayerNorm affine({3, 4});
    CHECK_EQ(affine.weight.shape(), (Shape{3, 4}));
    std::vector<float> w = randf(12, 41, 0.5, 2), b = randf(12, 42);
    affine.weight = fv(w, {3, 4}).requires_grad();
    affine.bias = fv(b, {3, 4}).requires_grad();
    Vec want;
    for (size_t i = 0; i < want_plain.size(); i++) want.push_back(want_plain[i] * w[i % 12] + b[i % 12]);
    CHECK_ALL_NEAR(vals(affine(x)), want, F32);
    CHECK_ALL_NEAR(vals(nn::functional::layer_norm(x, {3, 4}, affine.weight, affine.bias)), want, F32);
    nn::LayerNorm no_bias(4, 1e-5, true, false);
    auto named = no_bias.named_parameters();
    CHECK_EQ(named.size(), size_t(1));
    CHECK_EQ(named.at(0).first, std::string("weight"));
    CHECK(!no_bias.bias.defined());
}

TEST(nn_sequential_chains_and_collects_parameters) {
    tg::manual_seed(12);
    nn::Sequential net(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2), nn::Tanh());
    CHECK_EQ(net.layers.size(), size_t(4));
    std::vector<Tensor> ps = net.parameters();
    CHECK_EQ(ps.size(), size_t(4));
    auto l1 = std::dynamic_pointer_cast<nn::Linear>(net.layers[0]);
    auto l2 = std::dynamic_pointer_cast<nn::Linear>(net.layers[2]);
    CHECK(l1 && l2);
    if (!l1 || !l2 || ps.size() != 4) return;
    CHECK(same_node(ps[0], l1->weight) && same_node(ps[1], l1->bias));
    CHECK(same_node(ps[2], l2->weight) && same_node(ps[3], l2->bias));
    std::vector<float> xs = randf(6 * 3, 13, -2, 2);
    Vec h = linear_ref(D(xs), vals(l1->weight), vals(l1->bias), 6, 3, 4);
    for (double& v : h) v = std::max(v, 0.0);
    Vec want = linear_ref(h, vals(l2->weight), vals(l2->bias), 6, 4, 2);
    for (double& v : want) v = std::tanh(v);
    CHECK_ALL_NEAR(vals(net(fv(xs, {6, 3}))), want, F32);

    // deferred layers inside: parameters appear after the first call
    nn::Sequential lazy(nn::Linear(5), nn::ReLU(), nn::Linear(2));
    CHECK(lazy.parameters().empty());
    CHECK_EQ(lazy(Tensor::ones({3, 7})).shape(), (Shape{3, 2}));
    std::vector<Tensor> lp = lazy.parameters();
    CHECK_EQ(lp.size(), size_t(4));
    if (lp.size() == 4) {
        CHECK_EQ(lp[0].shape(), (Shape{5, 7}));
        CHECK_EQ(lp[2].shape(), (Shape{2, 5}));
    }
    // add() appends
    nn::Sequential built;
    built.add(std::make_shared<nn::Linear>(2, 3)).add(std::make_shared<nn::Sigmoid>());
    CHECK_EQ(built.parameters().size(), size_t(2));
    for (double v : vals(built(Tensor::ones({4, 2})))) CHECK(v > 0 && v < 1);
}

// reset_parameters(seeds) draws a layer's parameters again: from its own seeds, the values it
// was made with; Sequential hands each layer its share in order. Another count of seeds than
// the layer draws is an error that changes nothing.
TEST(nn_reset_parameters_draws_again_and_checks_the_count) {
    tg::manual_seed(14);
    nn::Sequential net(nn::Linear(3, 4), nn::ReLU(), nn::Dropout(0.5), nn::Conv1d(2, 3, 3),
                       nn::LSTMCell(2, 3), nn::Embedding(5, 2));
    std::vector<uint64_t> own = net.seeds;
    CHECK_EQ(own.size(), size_t(2 + 1 + 2 + 4 + 1));
    std::vector<Vec> made;
    for (const Tensor& p : net.parameters()) made.push_back(vals(p));
    std::vector<uint64_t> other = own;
    for (uint64_t& s : other) s += 1000;
    net.reset_parameters(other);
    CHECK(net.seeds == other);
    CHECK(net.at<nn::Dropout>(2).seeds == std::vector<uint64_t>{other[2]});
    std::vector<Tensor> ps = net.parameters();
    for (size_t i = 0; i < ps.size(); i++) CHECK(vals(ps[i]) != made[i]);
    net.reset_parameters(own);
    ps = net.parameters();
    for (size_t i = 0; i < ps.size(); i++) CHECK_ALL_NEAR(vals(ps[i]), made[i], 0);

    CHECK_THROWS(net.reset_parameters({1, 2}), "takes the 10 seeds", "got 2");
    CHECK(net.seeds == own);
    CHECK_THROWS(net.at<nn::Linear>(0).reset_parameters({1}), "Linear", "2 seeds", "got 1");
    CHECK_THROWS(net.at<nn::LSTMCell>(4).reset_parameters({1}), "LSTMCell", "4 seeds");
    CHECK_THROWS(net.at<nn::Embedding>(5).reset_parameters({}), "Embedding", "1 seeds");
    CHECK_THROWS(net.at<nn::Dropout>(2).reset_parameters({}), "1 seeds", "got 0");
    CHECK_THROWS(net.at<nn::ReLU>(1).reset_parameters({7}), "0 seeds", "got 1");
    nn::LSTM lstm(2, 3, 2);
    CHECK_THROWS(lstm.reset_parameters({1}), "LSTM", "9 seeds");
    CHECK_THROWS(net.at<nn::Conv1d>(3).reset_parameters({1}), "Conv1d", "2 seeds");
    nn::MultiheadAttention attention(4, 2);
    CHECK_THROWS(attention.reset_parameters({1}), "MultiheadAttention", "4 seeds");
    for (size_t i = 0; i < ps.size(); i++) CHECK_ALL_NEAR(vals(ps[i]), made[i], 0);
    nn::Linear lazy(4);
    lazy.reset_parameters({});   // nothing to draw before its first call
    CHECK(lazy.parameters().empty());
}

// model.zero_grad() forgets every parameter's gradient, as PyTorch's (set_to_none).
TEST(nn_module_zero_grad_forgets_every_gradient) {
    tg::manual_seed(15);
    nn::Sequential net(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
    net(Tensor::ones({2, 3})).sum().backward();
    for (const Tensor& p : net.parameters()) CHECK(p.grad().defined());
    net.zero_grad();
    for (const Tensor& p : net.parameters()) CHECK(!p.grad().defined());
    net(Tensor::ones({2, 3})).sum().backward();   // accumulates from nothing again
    CHECK_ALL_NEAR(vals(net.at<nn::Linear>(2).bias.grad()), (Vec{2, 2}), 0);
}

TEST(nn_init_bounds_and_standard_deviations) {
    const Shape shape{100, 200};   // 20000 samples
    // kaiming_uniform: U(-b, b), b = √(6/fan_in)
    {
        double b = std::sqrt(6.0 / 50);
        Moments m = moments(vals(nn::init::kaiming_uniform(shape, 50, 1)));
        CHECK(m.min >= -b && m.max <= b);
        CHECK(m.max > 0.98 * b && m.min < -0.98 * b);
        CHECK_NEAR(m.sd, b / std::sqrt(3.0), 0.03 * b);
        CHECK(std::fabs(m.mean) < 0.03 * m.sd);
    }
    // kaiming_normal: N(0, 2/fan_in)
    {
        double sd = std::sqrt(2.0 / 50);
        Moments m = moments(vals(nn::init::kaiming_normal(shape, 50, 2)));
        CHECK_NEAR(m.sd, sd, 0.03 * sd);
        CHECK(std::fabs(m.mean) < 0.03 * sd);
        CHECK(m.max > 3 * sd && m.min < -3 * sd);   // a normal, not a uniform, tail
    }
    // xavier_uniform: U(-b, b), b = √(6/(fan_in + fan_out))
    {
        double b = std::sqrt(6.0 / (30 + 70));
        Moments m = moments(vals(nn::init::xavier_uniform(shape, 30, 70, 3)));
        CHECK(m.min >= -b && m.max <= b);
        CHECK(m.max > 0.98 * b && m.min < -0.98 * b);
        CHECK_NEAR(m.sd, b / std::sqrt(3.0), 0.03 * b);
    }
    // xavier_normal: N(0, 2/(fan_in + fan_out))
    {
        double sd = std::sqrt(2.0 / (30 + 70));
        Moments m = moments(vals(nn::init::xavier_normal(shape, 30, 70, 4)));
        CHECK_NEAR(m.sd, sd, 0.03 * sd);
        CHECK(std::fabs(m.mean) < 0.03 * sd);
    }
    // uniform(low, high)
    {
        Moments m = moments(vals(nn::init::uniform(shape, 2, 5, 5)));
        CHECK(m.min >= 2 && m.max <= 5);
        CHECK_NEAR(m.mean, 3.5, 0.01);
    }
    // the seed decides the values
    CHECK(vals(nn::init::kaiming_normal({64}, 8, 21)) == vals(nn::init::kaiming_normal({64}, 8, 21)));
    CHECK(vals(nn::init::kaiming_normal({64}, 8, 21)) != vals(nn::init::kaiming_normal({64}, 8, 22)));
}

// =============================================================================================
// losses
// =============================================================================================

TEST(loss_cross_entropy_matches_loop) {
    const int64_t N = 6, C = 5;
    std::vector<float> logits = randf(size_t(N * C), 20, -3, 3);
    std::vector<int32_t> target = randi(size_t(N), 21, 0, int(C - 1));
    Vec per(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; n++) {
        double mx = -1e300, s = 0;
        for (int64_t c = 0; c < C; c++) mx = std::max(mx, double(logits[size_t(n * C + c)]));
        for (int64_t c = 0; c < C; c++) s += std::exp(logits[size_t(n * C + c)] - mx);
        per[size_t(n)] = mx + std::log(s) - logits[size_t(n * C + target[size_t(n)])];
    }
    double sum = 0;
    for (double v : per) sum += v;
    Tensor L = fv(logits, {N, C}), T = Tensor::from_vector(target);
    Tensor none = nn::cross_entropy(L, T, nn::Reduction::NONE);
    CHECK_EQ(none.shape(), (Shape{N}));
    CHECK_ALL_NEAR(vals(none), per, F32);
    Tensor mean = nn::cross_entropy(L, T), total = nn::cross_entropy(L, T, nn::Reduction::SUM);
    CHECK_EQ(mean.shape(), Shape{});
    CHECK_EQ(total.shape(), Shape{});
    CHECK_NEAR(mean.item(), sum / double(N), F32);
    CHECK_NEAR(total.item(), sum, F32);
    // [..., C] logits with [...] targets
    Tensor none3 = nn::cross_entropy(fv(logits, {2, 3, C}), Tensor::from_vector(target, {2, 3}), nn::Reduction::NONE);
    CHECK_EQ(none3.shape(), (Shape{2, 3}));
    CHECK_ALL_NEAR(vals(none3), per, F32);
    // the gradient of the mean: (softmax - onehot) / N
    Tensor Lp = fv(logits, {N, C}).requires_grad();
    Vec g = vals(tg::gradients(nn::cross_entropy(Lp, T), {Lp})[0]), gwant;
    for (int64_t n = 0; n < N; n++) {
        double mx = -1e300, s = 0;
        for (int64_t c = 0; c < C; c++) mx = std::max(mx, double(logits[size_t(n * C + c)]));
        for (int64_t c = 0; c < C; c++) s += std::exp(logits[size_t(n * C + c)] - mx);
        for (int64_t c = 0; c < C; c++)
            gwant.push_back((std::exp(logits[size_t(n * C + c)] - mx) / s - (c == target[size_t(n)])) / double(N));
    }
    CHECK_ALL_NEAR(g, gwant, F32);
    // ignored targets (PyTorch's -100, or another ignore_index) add 0 and no gradient; the mean
    // is over the rest, and every other target out of range is still an error
    for (int64_t ignore : {int64_t(-100), int64_t(target[1])}) {
        std::vector<int32_t> some = target;
        some[1] = some[4] = int32_t(ignore);
        std::vector<bool> ignored(static_cast<size_t>(N));
        Vec per_kept;
        for (int64_t n = 0; n < N; n++) {
            ignored[size_t(n)] = some[size_t(n)] == ignore;
            per_kept.push_back(ignored[size_t(n)] ? 0 : per[size_t(n)]);
        }
        double kept_sum = 0, kept = 0;
        for (int64_t n = 0; n < N; n++)
            if (!ignored[size_t(n)]) kept_sum += per[size_t(n)], kept += 1;
        Tensor S = Tensor::from_vector(some);
        CHECK_ALL_NEAR(vals(nn::cross_entropy(L, S, nn::Reduction::NONE, ignore)), per_kept, F32);
        CHECK_NEAR(nn::cross_entropy(L, S, nn::Reduction::SUM, ignore).item(), kept_sum, F32);
        Tensor Lk = fv(logits, {N, C}).requires_grad();
        Tensor mean_kept = nn::cross_entropy(Lk, S, nn::Reduction::MEAN, ignore);
        Vec gk = vals(tg::gradients(mean_kept, {Lk})[0]);
        CHECK_NEAR(mean_kept.item(), kept_sum / kept, F32);
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                size_t at = size_t(n * C + c);
                double want = ignored[size_t(n)] ? 0 : gwant[at] * double(N) / kept;
                CHECK_NEAR(gk[at], want, F32);
            }
    }
    std::vector<int32_t> below = target;
    below[0] = -1;
    CHECK_THROWS(nn::cross_entropy(L, Tensor::from_vector(below)).item(),
                 "cross_entropy: index out of range");
    {   // the gradient alone (the loss never computed) checks the labels too
        Tensor logits = L.detach().requires_grad();
        Tensor loss = nn::cross_entropy(logits, Tensor::from_vector(below));
        CHECK_THROWS(tg::gradients(loss, {logits})[0].realize(),
                     "cross_entropy (computing its gradient): index out of range [0, 5)",
                     "got -1");
    }
    // errors
    CHECK_THROWS(nn::cross_entropy(L, fv({0, 1, 2, 3, 4, 0})), "cross_entropy", "int32", "float32");
    CHECK_THROWS(nn::cross_entropy(L, Tensor::from_vector(std::vector<int32_t>{0, 1, 2})), "cross_entropy",
                 "[6,5]", "[6]", "[3]");
    CHECK_THROWS(nn::cross_entropy(L, Tensor::from_vector(target, {6, 1})), "cross_entropy", "[6,1]");
    CHECK_THROWS(nn::cross_entropy(Tensor::zeros({}), Tensor::from_vector(std::vector<int32_t>{0}, {})),
                 "cross_entropy");
}

// Values and gradients (of the result's sum) from PyTorch 1.13's F.cross_entropy, F.nll_loss,
// F.kl_div and the binary losses on these float64 inputs, rounded to 10 places
TEST(loss_options_match_pytorch_class_weights_smoothing_soft_targets_kl_pos_weight) {
    const double TOL = 1e-9;
    Vec logits = {0.5, -1.25, 2.0, 1.5, 0.25, -0.75, -2.0, 1.0, 0.5, 0.0, 3.0, -1.5};
    Tensor target = Tensor::from_vector(std::vector<int64_t>{0, 2, -100, 1});
    Tensor weight = Tensor::from_vector(Vec{0.5, 2.0, 1.5});
    Tensor probs = Tensor::from_vector(Vec{0.2, 0.3, 0.5, 1, 0, 0, 0.25, 0.25, 0.5, 0.6, 0.1, 0.3},
                                       {4, 3});
    auto check = [&](auto loss, const Vec& want, const Vec& want_grad) {
        Tensor x = Tensor::from_vector(logits, {4, 3}).requires_grad();
        Tensor v = loss(x);
        CHECK_ALL_NEAR(vals(v), want, TOL);
        CHECK_ALL_NEAR(vals(tg::gradients(v.sum(), {x})[0]), want_grad, TOL);
    };
    using R = nn::Reduction;
    check([&](const Tensor& x) { return nn::cross_entropy(x, target, R::MEAN, -100, 0.2, weight); },
          {1.3688534384}, {-0.078863303, -0.0282122099, 0.1070755129, 0.2550947918, 0.0421400881,
                           -0.2972348799, 0, 0, 0, 0.0135669885, 0.0065463892, -0.0201133777});
    check([&](const Tensor& x) { return nn::cross_entropy(x, target, R::NONE, -100, 0.2, weight); },
          {1.2384146554, 3.5766531605, 0, 0.6603459378},
          {-0.3154532119, -0.1128488398, 0.4283020517, 1.020379167, 0.1685603525, -1.1889395196, 0, 0,
           0, 0.0542679539, 0.0261855568, -0.0804535107});
    check([&](const Tensor& x) { return nn::cross_entropy(x, target, R::MEAN, -100, 0.2); },
          {1.5574694959}, {-0.2299488282, -0.0119799754, 0.2419288036, 0.2172578915, 0.0463899791,
                           -0.2636478706, 0, 0, 0, -0.0065791352, 0.0253109129, -0.0187317777});
    check([&](const Tensor& x) { return nn::cross_entropy(x, target, R::SUM, -100, 0, weight); },
          {4.8555476962}, {-0.4115899089, 0.0153633702, 0.3962265388, 1.0776605117, 0.308754906,
                           -1.3864154177, 0, 0, 0, 0.0938585221, -0.1148011891, 0.0209426671});
    check([&](const Tensor& x) { return nn::nll_loss(x, target, R::MEAN, -100, weight); },
          {-1.28125}, {-0.125, 0, 0, 0, 0, -0.375, 0, 0, 0, 0, -0.5, 0});
    // probabilities as targets: the mean is over the rows
    check([&](const Tensor& x) { return nn::cross_entropy(x, probs, R::MEAN, -100, 0.1, weight); },
          {1.8156556987}, {0.0369149238, -0.140617843, 0.1037029191, -0.0118941169, 0.0133511714,
                           -0.0014570545, -0.0219902354, 0.0777431113, -0.0557528759,
                           -0.0600712284, 0.1712339364, -0.111162708});
    Vec soft_grad = {-0.0231798179, -0.2692732597, 0.2924530776, -0.2815596588, 0.205836604,
                     0.0757230549, -0.2199411124, 0.3537488961, -0.1338077837, -0.553070739,
                     0.8425994054, -0.2895286665};
    check([&](const Tensor& x) { return nn::cross_entropy(x, probs, R::NONE); },
          {1.5076219831, 0.3306726094, 1.5045969023, 3.2091138953}, soft_grad);
    // kl_div of log_softmax(x) from probs: MEAN over the 12 elements, BATCHMEAN over the 4 rows
    check([&](const Tensor& x) { return nn::kl_div(x.log_softmax(-1), probs); }, {0.2987238234},
          {-0.0019316515, -0.0224394383, 0.0243710898, -0.0234633049, 0.0171530503, 0.0063102546,
           -0.018328426, 0.0294790747, -0.0111506486, -0.0460892282, 0.0702166171, -0.0241273889});
    check([&](const Tensor& x) { return nn::kl_div(x.log_softmax(-1), probs, R::BATCHMEAN); },
          {0.8961714701},
          {-0.0057949545, -0.0673183149, 0.0731132694, -0.0703899147, 0.051459151, 0.0189307637,
           -0.0549852781, 0.088437224, -0.0334519459, -0.1382676847, 0.2106498514, -0.0723821666});
    Tensor log_probs = probs.log().clamp(-50);
    check([&](const Tensor& x) { return nn::kl_div(x.log_softmax(-1), log_probs, R::SUM, true); },
          {3.5846858804}, soft_grad);
    // binary losses with a weight per row and a positive weight per class (the last row's 0)
    Tensor t = Tensor::from_vector(Vec{1, 0, 0.5, 0, 1, 1, 0.25, 0, 1, 1, 1, 0}, {4, 3});
    Tensor pos_weight = Tensor::from_vector(Vec{3.0, 0.5, 2.0});
    Tensor row_weight = Tensor::from_vector(Vec{1.0, 0.5, 2.0, 0.0}, {4, 1});
    check([&](const Tensor& x) {
              return nn::binary_cross_entropy_with_logits(x, t, R::NONE, row_weight, pos_weight);
          },
          {1.4222309525, 0.2519290813, 1.1903920166, 0.850706639, 0.143984855, 1.1368710061,
           3.3807840331, 2.626523375, 1.8963079367, 0, 0, 0},
          {-1.1326220064, 0.2227001388, 0.321195617, 0.4087872381, -0.1094558748, -0.6791786992,
           -1.1423912339, 1.4621171573, -1.5101626752, 0, 0, 0});
    check([&](const Tensor& x) {
              return nn::binary_cross_entropy_with_logits(x, t, R::MEAN, Tensor(), pos_weight);
          },
          {1.1153861015}, {-0.0943851672, 0.0185583449, 0.0267663014, 0.0681312063, -0.0182426458,
                           -0.1131964499, -0.0475996347, 0.0609215482, -0.0629234448, -0.125,
                           -0.001976078, 0.015202127});
    check([&](const Tensor& x) {
              return nn::binary_cross_entropy(x.sigmoid(), t, R::SUM, row_weight);
          },
          {8.388579294}, {-0.3775406688, 0.2227001388, 0.380797078, 0.4087872381, -0.2189117496,
                          -0.3395893496, -0.261594156, 1.4621171573, -0.7550813376, 0, 0, 0});
    // errors
    Tensor x = Tensor::from_vector(logits, {4, 3});
    CHECK_THROWS(nn::cross_entropy(x, target, R::MEAN, -100, 0, Tensor::ones({4})), "cross_entropy",
                 "weight", "[4]", "[3]", "[4,3]");
    CHECK_THROWS(nn::cross_entropy(x, target, R::MEAN, -100, 1.5), "cross_entropy",
                 "label_smoothing", "1.5");
    CHECK_THROWS(nn::cross_entropy(x, probs, R::MEAN, 0), "cross_entropy", "ignore_index",
                 "probability");
    CHECK_THROWS(nn::cross_entropy(x, probs.reshape({3, 4})), "cross_entropy", "[4,3]", "[3,4]");
    CHECK_THROWS(nn::cross_entropy(x, target, R::BATCHMEAN), "cross_entropy", "BATCHMEAN",
                 "kl_div");
    CHECK_THROWS(nn::mse_loss(x, x, R::BATCHMEAN), "mse_loss", "BATCHMEAN");
    CHECK_THROWS(nn::kl_div(x, probs.reshape({2, 6})), "kl_div", "[4,3]", "[2,6]");
    CHECK_THROWS(nn::binary_cross_entropy_with_logits(x, t, R::MEAN, Tensor(), Tensor::ones({4})),
                 "binary_cross_entropy_with_logits", "pos_weight", "[4]");
    CHECK_THROWS(nn::binary_cross_entropy(x.sigmoid(), t, R::MEAN, Tensor::ones({2, 1, 1})),
                 "binary_cross_entropy", "weight", "[2,1,1]", "[4,3]");
}

// Each case's values and its inputs' gradients from PyTorch 1.13 (tests/data/make_reference.py);
// a case named NAME_mean, NAME_sum or NAME_none runs with that reduction
TEST(loss_more_pytorch_losses_match_pytorch) {
    namespace F = nn::functional;
    using R = nn::Reduction;
    Reference ref = read_reference("tests/data/loss_reference.txt");
    CHECK_EQ(ref.cases.size(), size_t(34));
    auto in = [&](const char* name) { return ref.inputs.at(name); };
    Tensor sign = in("sign"), signs = in("signs"), labels = in("labels"), weight = in("weight");
    Tensor classes = in("classes").cast(DType::INT64), var = in("var"), counts = in("counts");
    Tensor targets = in("targets").cast(DType::INT32);
    using Loss = std::function<Tensor(const std::vector<Tensor>&, R)>;
    // each loss: the inputs it takes (they take gradients), and its call
    std::map<std::string, std::pair<std::vector<const char*>, Loss>> ours = {
        {"margin_ranking", {{"a", "b"}, [&](const std::vector<Tensor>& x, R r) {
             return F::margin_ranking_loss(x[0].slice(1, 0, 1).squeeze(1),
                                           x[1].slice(1, 0, 1).squeeze(1), sign, r, 0.5);
         }}},
        {"hinge_embedding", {{"a"}, [&](const std::vector<Tensor>& x, R r) {
             return F::hinge_embedding_loss(x[0], signs, r, 1.5);
         }}},
        {"soft_margin", {{"a"}, [&](const std::vector<Tensor>& x, R r) {
             return F::soft_margin_loss(x[0], signs, r);
         }}},
        {"multilabel_soft_margin", {{"a"}, [&](const std::vector<Tensor>& x, R r) {
             return F::multilabel_soft_margin_loss(x[0], labels, r, weight);
         }}},
        {"cosine_embedding", {{"a", "b"}, [&](const std::vector<Tensor>& x, R r) {
             return F::cosine_embedding_loss(x[0], x[1], sign, r, 0.2);
         }}},
        {"triplet_margin", {{"a", "b", "c"}, [&](const std::vector<Tensor>& x, R r) {
             return F::triplet_margin_loss(x[0], x[1], x[2], r);
         }}},
        {"gaussian_nll", {{"a", "b"}, [&](const std::vector<Tensor>& x, R r) {
             return F::gaussian_nll_loss(x[0], x[1], var, r);
         }}},
        {"poisson_nll", {{"a"}, [&](const std::vector<Tensor>& x, R r) {
             return F::poisson_nll_loss(x[0], counts, r);
         }}},
        {"multi_margin", {{"a"}, [&](const std::vector<Tensor>& x, R r) {
             return F::multi_margin_loss(x[0], classes, r);
         }}},
        {"triplet_margin_swap_p1", {{"a", "b", "c"}, [&](const std::vector<Tensor>& x, R) {
             return F::triplet_margin_loss(x[0], x[1], x[2], R::MEAN, 2.0, 1, 1e-6, true);
         }}},
        {"pairwise_distance", {{"a", "b"}, [&](const std::vector<Tensor>& x, R) {
             return F::pairwise_distance(x[0], x[1]);
         }}},
        {"gaussian_nll_full", {{"a", "b"}, [&](const std::vector<Tensor>& x, R) {
             return F::gaussian_nll_loss(x[0], x[1], x[1].abs() + 0.1, R::MEAN, true, 0.2);
         }}},
        {"poisson_nll_full", {{"a"}, [&](const std::vector<Tensor>& x, R) {
             return F::poisson_nll_loss(x[0].abs(), counts, R::NONE, false, true);
         }}},
        {"multi_margin_p2_weight", {{"a"}, [&](const std::vector<Tensor>& x, R) {
             return F::multi_margin_loss(x[0], classes, R::NONE, 2, 0.5, weight);
         }}},
        // PyTorch's layout: logits [N, C, d] with targets [N, d]
        {"cross_entropy_classes_on_axis_1", {{"logits"}, [&](const std::vector<Tensor>& x, R) {
             return F::cross_entropy(x[0], targets, R::NONE, 1, 0, weight);
         }}},
        {"nll_loss_classes_on_axis_1", {{"logits"}, [&](const std::vector<Tensor>& x, R) {
             return F::nll_loss(x[0], targets, R::MEAN, -100, weight);
         }}},
    };
    const std::vector<std::pair<std::string, R>> reductions = {
        {"_mean", R::MEAN}, {"_sum", R::SUM}, {"_none", R::NONE}};
    Cases cases;   // each case a loss and the reduction its name ends in (MEAN if none)
    for (const auto& [name, c] : ref.cases) {
        std::string loss = name;
        R r = R::MEAN;
        for (const auto& [suffix, reduction] : reductions)
            if (loss.size() > suffix.size() &&
                loss.compare(loss.size() - suffix.size(), suffix.size(), suffix) == 0) {
                loss.resize(loss.size() - suffix.size());
                r = reduction;
            }
        CHECK(ours.count(loss) == 1);
        if (!ours.count(loss)) continue;
        auto [inputs, f] = ours[loss];
        cases[name] = {inputs, [f = f, r](CaseInputs x) { return f(x, r); }};
    }
    check_cases(ref, cases, 1e-9);
    // errors
    Tensor a = in("a"), b = in("b");
    CHECK_THROWS(F::margin_ranking_loss(a, b.slice(0, 0, 2), signs), "margin_ranking_loss",
                 "[4,3]", "[2,3]");
    CHECK_THROWS(F::hinge_embedding_loss(a, sign), "hinge_embedding_loss", "[4,3]", "[4]");
    CHECK_THROWS(F::cosine_embedding_loss(a, b, signs), "cosine_embedding_loss", "target",
                 "[4,3]");
    CHECK_THROWS(F::triplet_margin_loss(a, b, in("c"), R::MEAN, 1, 0), "triplet_margin_loss",
                 "p");
    CHECK_THROWS(F::gaussian_nll_loss(a, b, Tensor::ones({4, 2})), "gaussian_nll_loss", "var",
                 "[4,2]");
    CHECK_THROWS(F::gaussian_nll_loss(a, b, var, R::MEAN, false, -1), "gaussian_nll_loss", "eps");
    CHECK_THROWS(F::multi_margin_loss(a, classes.slice(0, 0, 3)), "multi_margin_loss", "[3]",
                 "[4,3]");
    CHECK_THROWS(F::multi_margin_loss(a, classes, R::MEAN, 3), "multi_margin_loss", "p");
    CHECK_THROWS(F::multi_margin_loss(a, classes, R::MEAN, 1, 1, Tensor::ones({4})),
                 "multi_margin_loss", "weight", "[4]");
    CHECK_THROWS(F::multilabel_soft_margin_loss(a, labels.slice(1, 0, 2)),
                 "multilabel_soft_margin_loss", "[4,2]");
    CHECK_THROWS(F::poisson_nll_loss(a, counts, R::BATCHMEAN), "poisson_nll_loss", "BATCHMEAN");
}

// The loss objects hold PyTorch's options in its order and give their functions' values with
// them: each set away from its defaults
TEST(loss_objects_call_their_functions) {
    namespace F = nn::functional;
    using R = nn::Reduction;
    Reference ref = read_reference("tests/data/loss_reference.txt");
    auto in = [&](const char* name) { return ref.inputs.at(name); };
    Tensor a = in("a"), b = in("b"), c = in("c"), sign = in("sign"), signs = in("signs");
    Tensor labels = in("labels"), weight = in("weight"), var = in("var"), counts = in("counts");
    Tensor classes = in("classes").cast(DType::INT64), p = a.sigmoid();
    std::vector<std::pair<Tensor, Tensor>> pairs = {
        {nn::MSELoss{R::SUM}(a, b), F::mse_loss(a, b, R::SUM)},
        {nn::L1Loss{R::NONE}(a, b), F::l1_loss(a, b, R::NONE)},
        {nn::SmoothL1Loss{R::SUM, 0.5}(a, b), F::smooth_l1_loss(a, b, R::SUM, 0.5)},
        {nn::HuberLoss{R::NONE, 0.7}(a, b), F::huber_loss(a, b, R::NONE, 0.7)},
        {nn::CrossEntropyLoss{weight, 2, R::SUM, 0.1}(a, classes),
         F::cross_entropy(a, classes, R::SUM, 2, 0.1, weight)},
        {nn::NLLLoss{weight, 1, R::NONE}(a, classes), F::nll_loss(a, classes, R::NONE, 1, weight)},
        {nn::BCELoss{weight, R::SUM}(p, labels),
         F::binary_cross_entropy(p, labels, R::SUM, weight)},
        {nn::BCEWithLogitsLoss{weight, R::NONE, weight * 2}(a, labels),
         F::binary_cross_entropy_with_logits(a, labels, R::NONE, weight, weight * 2)},
        {nn::KLDivLoss{R::BATCHMEAN, true}(a, b), F::kl_div(a, b, R::BATCHMEAN, true)},
        {nn::SoftMarginLoss{R::SUM}(a, signs), F::soft_margin_loss(a, signs, R::SUM)},
        {nn::HingeEmbeddingLoss{1.5, R::NONE}(a, signs),
         F::hinge_embedding_loss(a, signs, R::NONE, 1.5)},
        {nn::MultiLabelSoftMarginLoss{weight, R::SUM}(a, labels),
         F::multilabel_soft_margin_loss(a, labels, R::SUM, weight)},
        {nn::MultiLabelMarginLoss{R::NONE}(
             a, Tensor::from_vector({1, -1, 0, 2, 0, -1, 0, 1, 2, -1, 2, 1}, {4, 3})),
         F::multilabel_margin_loss(
             a, Tensor::from_vector({1, -1, 0, 2, 0, -1, 0, 1, 2, -1, 2, 1}, {4, 3}), R::NONE)},
        {nn::MultiMarginLoss{2, 0.5, weight, R::NONE}(a, classes),
         F::multi_margin_loss(a, classes, R::NONE, 2, 0.5, weight)},
        {nn::PoissonNLLLoss{false, true, 1e-3, R::NONE}(a.abs(), counts),
         F::poisson_nll_loss(a.abs(), counts, R::NONE, false, true, 1e-3)},
        {nn::GaussianNLLLoss{true, 0.2, R::SUM}(a, b, var),
         F::gaussian_nll_loss(a, b, var, R::SUM, true, 0.2)},
        {nn::MarginRankingLoss{0.5, R::NONE}(a, b, signs),
         F::margin_ranking_loss(a, b, signs, R::NONE, 0.5)},
        {nn::CosineEmbeddingLoss{0.2, R::SUM}(a, b, sign),
         F::cosine_embedding_loss(a, b, sign, R::SUM, 0.2)},
        {nn::TripletMarginLoss{2, 1, 1e-3, true, R::NONE}(a, b, c),
         F::triplet_margin_loss(a, b, c, R::NONE, 2, 1, 1e-3, true)},
    };
    // CTC: 3 steps of 4 classes, one batch of a 2-label target, blank 3, zero_infinity
    Tensor log_probs =
        Tensor::from_vector(Vec{0.1, 0.5, -0.3, 0.2, 0.4, 0.3, 0.1, -0.2, 0.0, 0.6, 0.2, 0.1},
                            {3, 1, 4})
            .log_softmax(-1);
    Tensor targets = Tensor::from_vector({0, 1}, {1, 2});
    Tensor steps = Tensor::from_vector({3}), lengths = Tensor::from_vector({2});
    pairs.push_back({nn::CTCLoss{3, R::SUM, true}(log_probs, targets, steps, lengths),
                     F::ctc_loss(log_probs, targets, steps, lengths, R::SUM, 3, true)});
    for (auto& [object, function] : pairs) {
        CHECK(object.shape() == function.shape());
        CHECK_ALL_NEAR(vals(object), vals(function), 0);
    }
    // the defaults are the functions' defaults
    CHECK_ALL_NEAR(vals(nn::CrossEntropyLoss{}(a, classes)), vals(F::cross_entropy(a, classes)), 0);
    nn::CrossEntropyLoss criterion;
    criterion.label_smoothing = 0.25;
    CHECK_ALL_NEAR(vals(criterion(a, classes)),
                   vals(F::cross_entropy(a, classes, R::MEAN, -100, 0.25)), 0);
    CHECK_THROWS(nn::MSELoss{}(a, b.slice(0, 0, 2)), "mse_loss", "test_training.cpp");
}

TEST(loss_bce_with_logits_matches_loop_and_stays_finite) {
    std::vector<float> x = {-1000, -100, -30, -2.5f, -0.3f, 0, 0.7f, 3, 40, 100, 1000, 88.5f};
    std::vector<float> t = {0, 1, 0.5f, 1, 0, 0.25f, 1, 0, 1, 0, 1, 0.5f};
    Vec per;
    for (size_t i = 0; i < x.size(); i++) {
        double xi = x[i];
        per.push_back(std::max(xi, 0.0) - xi * t[i] + std::log1p(std::exp(-std::fabs(xi))));
    }
    double sum = 0;
    for (double v : per) sum += v;
    Tensor X = fv(x, {3, 4}), T = fv(t, {3, 4});
    Tensor none = nn::binary_cross_entropy_with_logits(X, T, nn::Reduction::NONE);
    CHECK_EQ(none.shape(), (Shape{3, 4}));
    Vec got = vals(none);
    for (double v : got) CHECK(std::isfinite(v));
    CHECK_ALL_NEAR(got, per, F32);
    CHECK_NEAR(nn::binary_cross_entropy_with_logits(X, T).item(), sum / 12, F32);
    CHECK_NEAR(nn::binary_cross_entropy_with_logits(X, T, nn::Reduction::SUM).item(), sum, F32);
    // the gradient, sigmoid(x) - t over N, is finite too
    Tensor xp = fv(x, {3, 4}).requires_grad();
    Vec g = vals(tg::gradients(nn::binary_cross_entropy_with_logits(xp, T), {xp})[0]);
    for (size_t i = 0; i < x.size(); i++) {
        CHECK(std::isfinite(g[i]));
        CHECK_NEAR(g[i], (1 / (1 + std::exp(-double(x[i]))) - t[i]) / 12, F32);
    }
    CHECK_THROWS(nn::binary_cross_entropy_with_logits(X, fv(t, {4, 3})), "binary_cross_entropy_with_logits",
                 "[3,4]", "[4,3]");
}

TEST(loss_mse_and_hinge_match_loop) {
    std::vector<float> p = randf(12, 30, -2, 2), t = randf(12, 31, -2, 2);
    Vec sq;
    double sum = 0;
    for (size_t i = 0; i < p.size(); i++) {
        double d = double(p[i]) - double(t[i]);
        sq.push_back(d * d);
        sum += d * d;
    }
    Tensor P = fv(p, {3, 4}), T = fv(t, {3, 4});
    CHECK_ALL_NEAR(vals(nn::mse_loss(P, T, nn::Reduction::NONE)), sq, F32);
    CHECK_EQ(nn::mse_loss(P, T, nn::Reduction::NONE).shape(), (Shape{3, 4}));
    CHECK_NEAR(nn::mse_loss(P, T).item(), sum / 12, F32);
    CHECK_NEAR(nn::mse_loss(P, T, nn::Reduction::SUM).item(), sum, F32);
    CHECK_THROWS(nn::mse_loss(P, fv(t, {4, 3})), "mse_loss", "[3,4]", "[4,3]");
    CHECK_THROWS(nn::mse_loss(P, fv(t)), "mse_loss", "[3,4]", "[12]");

    std::vector<float> s = {-2, -0.5f, 0, 0.5f, 1, 1.5f, 3, -1, 0.25f, 2};
    std::vector<float> y = {1, 1, -1, -1, 1, -1, 1, -1, 1, -1};
    Vec h;
    double hs = 0;
    for (size_t i = 0; i < s.size(); i++) {
        h.push_back(std::max(0.0, 1 - double(y[i]) * s[i]));
        hs += h.back();
    }
    Tensor S = fv(s), Y = fv(y);
    CHECK_ALL_NEAR(vals(nn::hinge_loss(S, Y, nn::Reduction::NONE)), h, F32);
    CHECK_NEAR(nn::hinge_loss(S, Y).item(), hs / 10, F32);
    CHECK_NEAR(nn::hinge_loss(S, Y, nn::Reduction::SUM).item(), hs, F32);
    CHECK_THROWS(nn::hinge_loss(S, fv(y, {10, 1})), "hinge_loss", "[10]", "[10,1]");
}

// =============================================================================================
// optimizers
// =============================================================================================

namespace {
// loss(p) = ½ Σ w (p - c)²  →  grad = w (p - c)
struct Quadratic {
    std::vector<float> p0, c, w;
    explicit Quadratic(size_t n, uint64_t seed)
        : p0(randf(n, seed, -1, 1)), c(randf(n, seed + 1, -1, 1)), w(randf(n, seed + 2, 0.5, 2)) {}
    Tensor loss(const Tensor& p) const {
        Tensor d = p - fv(c, p.shape());
        return (d * d * fv(w, p.shape())).sum() * 0.5f;
    }
    double grad(const Vec& p, size_t i) const { return double(w[i]) * (p[i] - double(c[i])); }
};
// one training step, eagerly: zero_grad, forward, backward, step
void quad_step(const Quadratic& q, const Tensor& p, optim::Optimizer& opt) {
    opt.zero_grad();
    Tensor loss = q.loss(p);
    loss.backward();
    opt.step();
}
// p [2,3]: a matrix parameter
Tensor quad_param(const Quadratic& q) { return fv(q.p0, {2, 3}).requires_grad(); }
}  // namespace

// The gradients are c1 and c2: PyTorch's norms of them (1: Σ|g|, ∞: max |g|), scales and clamps
TEST(nn_utils_clip_grad_norm_types_clip_grad_value_and_parameter_vectors) {
    const Vec c1 = {0.5, -2.0, 1.5, 0.25, -0.75, 3.0}, c2 = {-1.0, 0.125, 2.5, -0.5};
    auto fresh = [&](Tensor& p1, Tensor& p2) {
        p1 = Tensor::zeros({2, 3}, DType::FLOAT64).requires_grad();
        p2 = Tensor::zeros({4}, DType::FLOAT64).requires_grad();
        ((p1 * Tensor::from_vector(c1, {2, 3})).sum() + (p2 * Tensor::from_vector(c2)).sum())
            .backward();
    };
    auto scaled = [](const Vec& v, double by) {
        Vec out;
        for (double x : v) out.push_back(x * by);
        return out;
    };
    Tensor p1, p2;
    for (double norm_type : {1.0, double(INFINITY), 2.0, 3.0}) {
        fresh(p1, p2);
        double norm = 0;
        for (const Vec* c : {&c1, &c2})
            for (double g : *c)
                norm = norm_type == INFINITY ? std::max(norm, std::fabs(g))
                                             : norm + std::pow(std::fabs(g), norm_type);
        if (norm_type != INFINITY) norm = std::pow(norm, 1 / norm_type);
        Tensor got = nn::clip_grad_norm_({p1, p2}, 1.5, norm_type);
        CHECK_NEAR(got.item(), norm, 1e-6);
        double scale = std::min(1.0, 1.5 / (norm + 1e-6));
        CHECK_ALL_NEAR(vals(p1.grad()), scaled(c1, scale), 1e-6);
        CHECK_ALL_NEAR(vals(p2.grad()), scaled(c2, scale), 1e-6);
    }
    fresh(p1, p2);
    nn::clip_grad_value_({p1, p2}, 1.0);
    CHECK_ALL_NEAR(vals(p1.grad()), (Vec{0.5, -1, 1, 0.25, -0.75, 1}), 0);
    CHECK_ALL_NEAR(vals(p2.grad()), (Vec{-1, 0.125, 1, -0.5}), 0);
    // a parameter vector and back
    Tensor v = nn::parameters_to_vector({p1, p2});
    CHECK_EQ(v.shape(), (Shape{10}));
    Vec numbers;
    for (int i = 0; i < 10; i++) numbers.push_back(i * 0.5);
    nn::vector_to_parameters(Tensor::from_vector(numbers), {p1, p2});
    CHECK_ALL_NEAR(vals(p1), (Vec{0, 0.5, 1, 1.5, 2, 2.5}), 0);
    CHECK_ALL_NEAR(vals(p2), (Vec{3, 3.5, 4, 4.5}), 0);
    CHECK_ALL_NEAR(vals(nn::parameters_to_vector({p1, p2})), numbers, 0);
    CHECK_THROWS(nn::vector_to_parameters(Tensor::zeros({9}), {p1, p2}), "vector_to_parameters",
                 "[9]", "[10]");
    CHECK_THROWS(nn::clip_grad_norm_({p1}, 1, 0), "clip_grad_norm_", "norm_type");
    CHECK_THROWS(nn::clip_grad_value_({p1}, -1), "clip_grad_value_", "-1");
}

TEST(optim_sgd_one_step_matches_hand_computation) {
    Quadratic q(6, 40);
    const double lr = 0.05, wd = 0.1;
    Tensor p = quad_param(q), alias = p;
    optim::SGD opt({p}, lr, 0, wd);
    Tensor loss = q.loss(p);
    opt.zero_grad();
    loss.backward();
    CHECK(!loss.realized());   // pending until the step's program
    opt.step();
    CHECK(loss.realized());
    Vec p0 = D(q.p0), want, g;
    double l = 0;
    for (size_t i = 0; i < 6; i++) {
        g.push_back(q.grad(p0, i));
        want.push_back(p0[i] - lr * (g[i] + wd * p0[i]));
        l += 0.5 * q.w[i] * (p0[i] - q.c[i]) * (p0[i] - q.c[i]);
    }
    CHECK_NEAR(loss.item(), l, F32);       // the loss of the parameters before the update
    CHECK_ALL_NEAR(vals(p.grad()), g, F32);
    CHECK_ALL_NEAR(vals(p), want, F32);
    CHECK_EQ(p.shape(), (Shape{2, 3}));
    // in place: a handle copied before the step sees the new values
    CHECK(vals(alias) == vals(p));
    CHECK(same_node(alias, p));
    // without zero_grad, a second backward adds to the gradient
    Tensor p2 = quad_param(q);
    optim::SGD acc({p2}, lr);
    q.loss(p2).backward();
    q.loss(p2).backward();
    acc.step();
    Vec g2, twice;
    for (size_t i = 0; i < 6; i++) {
        g2.push_back(2 * g[i]);
        twice.push_back(p0[i] - lr * g2[i]);
    }
    CHECK_ALL_NEAR(vals(p2.grad()), g2, F32);
    CHECK_ALL_NEAR(vals(p2), twice, F32);
    // a parameter that has no gradient is left alone
    Tensor unused = fv({1, 2}).requires_grad();
    optim::SGD opt2({p, unused}, lr);
    quad_step(q, p, opt2);
    CHECK_EQ(vals(unused), (Vec{1, 2}));
}

namespace {
void check_sgd_momentum(bool nesterov) {
    Quadratic q(6, 50);
    const double lr = 0.1, mu = 0.9, wd = 0.01;
    Tensor p = quad_param(q);
    optim::SGD opt({p}, lr, mu, wd, nesterov);
    CHECK(opt.nesterov == nesterov);
    Vec ref = D(q.p0), buf(6, 0.0);
    for (int step = 0; step < 3; step++) {
        quad_step(q, p, opt);
        Vec next = ref;
        for (size_t i = 0; i < 6; i++) {   // OCANNL's sgd_one
            double d = q.grad(ref, i) + wd * ref[i];
            buf[i] = mu * buf[i] + d;
            d = nesterov ? d + mu * buf[i] : buf[i];
            next[i] = ref[i] - lr * d;
        }
        ref = next;
        CHECK_ALL_NEAR(vals(p), ref, F32);
    }
    // momentum makes a difference: plain SGD after 3 steps is elsewhere
    Vec plain = D(q.p0);
    for (int step = 0; step < 3; step++) {
        Vec next = plain;
        for (size_t i = 0; i < 6; i++) next[i] = plain[i] - lr * (q.grad(plain, i) + wd * plain[i]);
        plain = next;
    }
    double diff = 0;
    for (size_t i = 0; i < 6; i++) diff = std::max(diff, std::fabs(plain[i] - ref[i]));
    CHECK(diff > 1e-3);
}
}  // namespace

TEST(optim_sgd_momentum_three_steps) { check_sgd_momentum(false); }
TEST(optim_sgd_nesterov_three_steps) { check_sgd_momentum(true); }

namespace {
// PyTorch's Adam / AdamW with bias correction, in double
Vec adam_reference(const Quadratic& q, int steps, double lr, double b1, double b2, double eps, double wd,
                   bool decoupled, bool amsgrad = false) {
    Vec p = D(q.p0), m(p.size(), 0.0), v(p.size(), 0.0), v_max(p.size(), 0.0);
    for (int t = 1; t <= steps; t++) {
        Vec next = p;
        for (size_t i = 0; i < p.size(); i++) {
            double g = q.grad(p, i);
            if (!decoupled) g += wd * p[i];
            m[i] = b1 * m[i] + (1 - b1) * g;
            v[i] = b2 * v[i] + (1 - b2) * g * g;
            v_max[i] = std::max(v_max[i], v[i]);   // amsgrad: the largest v so far
            double mhat = m[i] / (1 - std::pow(b1, t));
            double vhat = (amsgrad ? v_max[i] : v[i]) / (1 - std::pow(b2, t));
            double upd = mhat / (std::sqrt(vhat) + eps);
            if (decoupled) upd += wd * p[i];
            next[i] = p[i] - lr * upd;
        }
        p = next;
    }
    return p;
}
}  // namespace

TEST(optim_adam_three_steps_match_reference) {
    Quadratic q(6, 60);
    {
        Tensor p = quad_param(q);
        optim::Adam opt({p}, 0.1);
        for (int s = 1; s <= 3; s++) {
            quad_step(q, p, opt);
            CHECK_ALL_NEAR(vals(p), adam_reference(q, s, 0.1, 0.9, 0.999, 1e-8, 0, false), 1e-5);
        }
    }
    {   // other betas, eps and an L2 weight decay added to the gradient
        Tensor p = quad_param(q);
        optim::Adam opt({p}, 0.05, 0.8, 0.99, 1e-6, 0.2);
        for (int s = 1; s <= 3; s++) quad_step(q, p, opt);
        CHECK_ALL_NEAR(vals(p), adam_reference(q, 3, 0.05, 0.8, 0.99, 1e-6, 0.2, false), 1e-5);
    }
}

TEST(optim_adamw_three_steps_match_reference) {
    Quadratic q(6, 70);
    Tensor p = quad_param(q);
    optim::AdamW opt({p}, 0.1, 0.9, 0.999, 1e-8, 0.3);
    CHECK(opt.decoupled);
    for (int s = 1; s <= 3; s++) {
        quad_step(q, p, opt);
        CHECK_ALL_NEAR(vals(p), adam_reference(q, s, 0.1, 0.9, 0.999, 1e-8, 0.3, true), 1e-5);
    }
    // decoupled decay differs from Adam's L2 decay
    Vec coupled = adam_reference(q, 3, 0.1, 0.9, 0.999, 1e-8, 0.3, false);
    Vec got = vals(p);
    double diff = 0;
    for (size_t i = 0; i < got.size(); i++) diff = std::max(diff, std::fabs(got[i] - coupled[i]));
    CHECK(diff > 1e-3);
}

// amsgrad divides by the largest v so far: where the gradient shrinks (the quadratic's, as p
// nears c) and v with it (β2 0.6 forgets fast), p moves less than Adam's; the state has
// max_exp_avg_sq
TEST(optim_adam_amsgrad_matches_reference) {
    Quadratic q(6, 75);
    for (bool decoupled : {false, true}) {
        Tensor p = quad_param(q);
        optim::Adam opt({p}, 0.2, 0.9, 0.6, 1e-8, 0.1, decoupled, true);
        for (int s = 1; s <= 4; s++) {
            quad_step(q, p, opt);
            CHECK_ALL_NEAR(vals(p), adam_reference(q, s, 0.2, 0.9, 0.6, 1e-8, 0.1, decoupled, true),
                           1e-5);
        }
        Vec plain = adam_reference(q, 4, 0.2, 0.9, 0.6, 1e-8, 0.1, decoupled), got = vals(p);
        double diff = 0;
        for (size_t i = 0; i < got.size(); i++) diff = std::max(diff, std::fabs(got[i] - plain[i]));
        CHECK(diff > 1e-4);
        CHECK(opt.state_dict().count("state.0.max_exp_avg_sq") == 1);
    }
    Tensor p = quad_param(q);
    optim::AdamW opt({p}, 0.2, 0.9, 0.6, 1e-8, 0.1, true);
    CHECK(opt.amsgrad && opt.decoupled);
}

// A group's parameters move as an optimizer of the group's settings alone moves them; its lr
// follows the optimizer's (set_lr here) in proportion
TEST(optim_param_groups_follow_their_settings) {
    Quadratic qa(6, 80), qb(6, 81);
    auto compare = [&](auto make_grouped, auto make_alone) {
        Tensor a = quad_param(qa), b = quad_param(qb), a1 = quad_param(qa), b1 = quad_param(qb);
        auto grouped = make_grouped(a, b);
        auto alone_a = make_alone(a1, 0.05, 0.0);
        auto alone_b = make_alone(b1, 0.1, -1.0);   // -1: the optimizer's weight_decay
        for (int s = 1; s <= 4; s++) {
            if (s == 3) grouped.set_lr(0.2), alone_a.set_lr(0.1), alone_b.set_lr(0.2);
            grouped.zero_grad();
            (qa.loss(a) + qb.loss(b)).backward();
            grouped.step();
            quad_step(qa, a1, alone_a);
            quad_step(qb, b1, alone_b);
        }
        CHECK_ALL_NEAR(vals(a), vals(a1), 1e-6);
        CHECK_ALL_NEAR(vals(b), vals(b1), 1e-6);
    };
    using optim::ParamGroup;
    compare([](Tensor a, Tensor b) {
                return optim::SGD({{{a}, 0.05, 0.0}, {{b}}}, 0.1, 0.9, 0.3);
            },
            [](Tensor p, double lr, double wd) {
                return optim::SGD({p}, lr, 0.9, wd < 0 ? 0.3 : wd);
            });
    compare([](Tensor a, Tensor b) {
                return optim::AdamW({{{a}, 0.05, 0.0}, {{b}}}, 0.1, 0.9, 0.99, 1e-8, 0.3, true);
            },
            [](Tensor p, double lr, double wd) {
                return optim::AdamW({p}, lr, 0.9, 0.99, 1e-8, wd < 0 ? 0.3 : wd, true);
            });
    compare([](Tensor a, Tensor b) {
                return optim::RMSprop({{{a}, 0.05, 0.0}, {{b}}}, 0.1, 0.9, 1e-8, 0.3);
            },
            [](Tensor p, double lr, double wd) {
                return optim::RMSprop({p}, lr, 0.9, 1e-8, wd < 0 ? 0.3 : wd);
            });
    compare([](Tensor a, Tensor b) {
                return optim::Adagrad({{{a}, 0.05, 0.0}, {{b}}}, 0.1, 0.01, 0.3);
            },
            [](Tensor p, double lr, double wd) {
                return optim::Adagrad({p}, lr, 0.01, wd < 0 ? 0.3 : wd);
            });
    Tensor a = quad_param(qa), b = quad_param(qb);
    CHECK_THROWS(optim::SGD({{{a, b}}, {{b}}}, 0.1), "SGD", "a parameter ([2,3]) is in groups 0 and 1");
    CHECK_THROWS(optim::Adam({{{a}, -0.1}}, 0.1), "Adam", "group 0's lr", "-0.1");
    CHECK_THROWS(optim::AdamW({{{a}}, {{b}, std::nullopt, -1.0}}), "AdamW", "group 1's weight_decay");
    CHECK_THROWS(optim::SGD({{{a}, 0.1}}, 0.0), "SGD", "group 0's lr 0.1", "optimizer's, which is 0");
}

// ReduceLROnPlateau against PyTorch 1.13's rates after each step, for these metrics
TEST(optim_reduce_lr_on_plateau_matches_pytorch) {
    auto run = [](const Vec& metrics, auto make) {
        Tensor p = fv({0.f}).requires_grad();
        optim::SGD opt({p}, 1.0);
        optim::ReduceLROnPlateau plateau = make(opt);
        Vec rates;
        for (double m : metrics) {
            plateau.step(Tensor::from_vector(Vec{m}, {}));
            rates.push_back(opt.lr.item());
        }
        return rates;
    };
    Vec falling = {5, 4, 4, 4, 4, 3.9999, 3.9, 3.9, 3.9, 3.9, 3.9, 3.9, 3.9, 3.9};
    CHECK_ALL_NEAR(run(falling, [](optim::Optimizer& o) {
                       return optim::ReduceLROnPlateau(o, false, 0.5, 2);
                   }),
                   (Vec{1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125, 0.125}), 1e-7);
    CHECK_ALL_NEAR(run(falling, [](optim::Optimizer& o) {
                       return optim::ReduceLROnPlateau(o, false, 0.5, 1, 0.01, false, 2, 0.2);
                   }),
                   (Vec{1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.2, 0.2}), 1e-7);
    CHECK_ALL_NEAR(run({1, 2, 2, 2, 2.5, 2.5, 2.5, 2.5}, [](optim::Optimizer& o) {
                       return optim::ReduceLROnPlateau(o, true, 0.1, 1);
                   }),
                   (Vec{1, 1, 1, 0.1, 0.1, 0.1, 0.01, 0.01}), 1e-7);
    Tensor p = fv({0.f}).requires_grad();
    optim::SGD opt({p}, 1.0);
    CHECK_THROWS(optim::ReduceLROnPlateau(opt, false, 1.5), "ReduceLROnPlateau", "factor 1.5");
    CHECK_THROWS(optim::ReduceLROnPlateau(opt, false, 0.1, -1), "ReduceLROnPlateau", "patience -1");
}

// dampening: b = μb + (1 - dampening)·d, b starting as the first d undamped, as PyTorch's; a
// parameter whose first gradient comes late starts its buffer then
TEST(optim_sgd_dampening_matches_reference) {
    Quadratic q(6, 90);
    Tensor p = quad_param(q), late = fv({2.f}).requires_grad();
    optim::SGD opt({p, late}, 0.1, 0.9, 0.01, false, 0.3);
    Vec ref = D(q.p0), buf(6, 0.0);
    double late_ref = 2, late_buf = 0;
    for (int s = 1; s <= 4; s++) {
        opt.zero_grad();
        Tensor loss = q.loss(p);
        if (s >= 3) loss = loss + (late * late).sum();   // late's gradient from step 3 on
        loss.backward();
        opt.step();
        Vec grads;
        for (size_t i = 0; i < 6; i++) grads.push_back(q.grad(ref, i) + 0.01 * ref[i]);
        for (size_t i = 0; i < 6; i++) {
            buf[i] = s == 1 ? grads[i] : 0.9 * buf[i] + 0.7 * grads[i];
            ref[i] -= 0.1 * buf[i];
        }
        if (s >= 3) {
            double d = 2 * late_ref + 0.01 * late_ref;
            late_buf = s == 3 ? d : 0.9 * late_buf + 0.7 * d;
            late_ref -= 0.1 * late_buf;
        }
        CHECK_ALL_NEAR(vals(p), ref, 1e-5);
        CHECK_NEAR(vals(late)[0], late_ref, 1e-5);
    }
    CHECK(opt.state_dict().count("state.1.skipped") == 1);
    CHECK_THROWS(optim::SGD({p}, 0.1, 0.9, 0, true, 0.1), "SGD", "nesterov", "dampening");
    CHECK_THROWS(optim::SGD({p}, 0.1, 0.9, 0, false, -0.1), "SGD", "dampening");
}

// As PyTorch's, Adam, AdamW and Adagrad count each parameter's steps apart: b, with no
// gradient in the first two steps, takes a first step (bias correction 1 - β, no lr decay)
// in the third, to 1 - lr·(g/(|g| + eps) + decay); the state says it skipped two steps.
TEST(optim_steps_are_counted_per_parameter) {
    auto check = [](auto make, const char* name, double decay) {
        Tensor a = Tensor::from_vector({1.0f}).requires_grad();
        Tensor b = Tensor::from_vector({1.0f}).requires_grad();
        auto opt = make(std::vector<Tensor>{a, b});
        for (int s = 0; s < 3; s++) {
            Tensor loss = (a * a).sum();
            if (s == 2) loss = loss + (b * 2.0f).sum();
            opt.zero_grad();
            loss.backward();
            opt.step();
        }
        double torch_b = 1 - 0.1 * (2 / (2 + 1e-8) + decay);   // a first step, lr 0.1
        if (std::fabs(b.item() - torch_b) > 1e-6)
            th::report(__FILE__, __LINE__, std::string(name) + ": b " + std::to_string(b.item()) +
                                               ", PyTorch's " + std::to_string(torch_b));
        auto state = opt.state_dict();
        CHECK_EQ(state.at("state.0.skipped").item(), 0.0);
        CHECK_EQ(state.at("state.1.skipped").item(), 2.0);
        CHECK_EQ(state.at("t").item(), 3.0);
        // a state saved before the counts were kept loads with 0 for each
        auto before = state;
        before.erase("state.0.skipped");
        before.erase("state.1.skipped");
        auto fresh = make(std::vector<Tensor>{a, b});
        fresh.load_state_dict(state);
        CHECK_EQ(fresh.state_dict().at("state.1.skipped").item(), 2.0);
        fresh.load_state_dict(before);
        CHECK_EQ(fresh.state_dict().at("state.1.skipped").item(), 0.0);
        CHECK_EQ(fresh.state_dict().at("t").item(), 3.0);
    };
    check([](std::vector<Tensor> ps) { return optim::Adam(ps, 0.1); }, "Adam", 0);
    check([](std::vector<Tensor> ps) { return optim::AdamW(ps, 0.1); }, "AdamW", 0.01);
    check([](std::vector<Tensor> ps) { return optim::Adagrad(ps, 0.1, 1.0, 0, 0, 1e-8); },
          "Adagrad", 0);
}

TEST(optim_set_lr_changes_step_without_recompiling) {
    // loss = Σ c·p: the gradient is c whatever p is, so each step moves p by -lr·c
    std::vector<float> c = {1, -2, 0.5f, 4};
    Tensor p = fv({0, 0, 0, 0}).requires_grad();
    optim::SGD opt({p}, 0.1);
    auto step = [&] {
        opt.zero_grad();
        (p * fv(c)).sum().backward();
        opt.step();
    };
    step();
    Vec after1 = vals(p);
    CHECK_ALL_NEAR(after1, (Vec{-0.1, 0.2, -0.05, -0.4}), F32);
    opt.set_lr(0.5);
    CHECK_NEAR(opt.lr.item(), 0.5, 0);
    tg::Stats before = tg::stats();
    step();
    tg::Stats after = tg::stats();
    CHECK_EQ(after.compiles, before.compiles);
    // not found on disk either: the very program of the first step ran again
    CHECK_EQ(after.disk_cache_hits, before.disk_cache_hits);
    CHECK_EQ(after.programs_run, before.programs_run + 1);
    Vec after2 = vals(p);
    for (size_t i = 0; i < 4; i++) CHECK_NEAR(after2[i] - after1[i], -0.5 * c[i], F32);
    opt.set_lr(0);
    step();
    CHECK(vals(p) == after2);
}

TEST(optim_updates_module_parameters_in_place) {
    tg::manual_seed(80);
    nn::Linear lin(3, 2);
    Tensor w_alias = lin.weight, b_alias = lin.bias;
    Vec w0 = vals(lin.weight), b0 = vals(lin.bias);
    optim::SGD opt(lin.parameters(), 0.1);
    Tensor x = fv(randf(12, 81), {4, 3});
    Tensor loss = lin(x).sum();
    loss.backward();
    opt.step();
    // d loss/dW[o,i] = Σ_r x[r,i], d loss/db[o] = 4
    Vec xs = vals(x), w1 = vals(lin.weight), b1 = vals(lin.bias);
    for (size_t o = 0; o < 2; o++) {
        for (size_t i = 0; i < 3; i++) {
            double g = 0;
            for (size_t r = 0; r < 4; r++) g += xs[r * 3 + i];
            CHECK_NEAR(w1[o * 3 + i], w0[o * 3 + i] - 0.1 * g, F32);
        }
        CHECK_NEAR(b1[o], b0[o] - 0.4, F32);
    }
    CHECK(same_node(lin.weight, w_alias) && same_node(opt.params[0], w_alias));
    CHECK(vals(w_alias) == w1 && vals(b_alias) == b1);
    CHECK(w1 != w0);
    CHECK_THROWS(optim::SGD({Tensor::zeros({2})}, 0.1), "optimizer", "require grad");
}

// =============================================================================================
// jit
// =============================================================================================

namespace {
struct Model {
    std::shared_ptr<nn::Sequential> net;
    std::unique_ptr<optim::Optimizer> opt;
};
Model make_model(uint64_t seed, bool adam) {
    tg::manual_seed(seed);
    Model m;
    m.net = std::make_shared<nn::Sequential>(nn::Linear(2, 8), nn::ReLU(), nn::Linear(8, 8), nn::Tanh(),
                                             nn::Linear(8, 1));
    if (adam) m.opt = std::make_unique<optim::Adam>(m.net->parameters(), 0.01);
    else m.opt = std::make_unique<optim::SGD>(m.net->parameters(), 0.05, 0.9, 1e-3);
    return m;
}
// the step that runs eagerly and under the jit: the hinge loss of a batch of points
Tensor train_step(Model& m, const tg::data::Dataset& d, const Tensor& idx) {
    Tensor x = d.X[idx], y = d.Y[idx];
    Tensor loss = nn::hinge_loss((*m.net)(x).reshape({-1}), y);
    m.opt->zero_grad();
    loss.backward();
    m.opt->step();
    return loss;
}
int64_t prepared(const tg::Stats& s) { return s.compiles + s.disk_cache_hits + s.memory_cache_hits; }

void check_jit_matches_eager(bool adam) {
    tg::data::Dataset d = tg::data::moons(64, 0.1, 5);
    std::vector<Tensor> batches = tg::data::batches(64, 16, 1), more = tg::data::batches(64, 16, 2);
    batches.insert(batches.end(), more.begin(), more.end());
    Model eager = make_model(300, adam), jitted = make_model(300, adam);
    std::vector<Tensor> pe = eager.net->parameters(), pj = jitted.net->parameters();
    CHECK_EQ(pe.size(), size_t(6));
    std::vector<Vec> start;
    for (size_t i = 0; i < pe.size(); i++) {
        start.push_back(vals(pe[i]));
        CHECK(vals(pj[i]) == start.back());   // the same start
    }
    tg::Jit step([&](const std::vector<Tensor>& in) { return train_step(jitted, d, in[0]); });
    const int N = 5;
    std::vector<double> le, lj;
    for (int s = 0; s < N; s++) {
        Tensor l = train_step(eager, d, batches[size_t(s)]);
        le.push_back(l.item());
        lj.push_back(step({batches[size_t(s)]}).item());
    }
    CHECK_EQ(step.replays(), int64_t(N - 1));
    CHECK_EQ(lj, le);
    for (size_t i = 0; i < pe.size(); i++) {
        CHECK_EQ(pj[i].to_vector(), pe[i].to_vector());
        CHECK(vals(pj[i]) != start[i]);   // it was updated
    }
    CHECK(le.front() != le.back());   // it did train
}
}  // namespace

TEST(jit_first_call_compiles_one_program_then_replays) {
    tg::manual_seed(200);
    // a structure used nowhere else: widths 2→5→1, sigmoid, AdamW
    nn::Sequential net(nn::Linear(2, 5), nn::Sigmoid(), nn::Linear(5, 1));
    optim::AdamW opt(net.parameters(), 0.02);
    std::vector<float> xs = randf(8 * 2, 201), ys(8);
    for (size_t i = 0; i < 8; i++) ys[i] = xs[2 * i] > 0 ? 1.0f : -1.0f;
    tg::Jit step([&](const std::vector<Tensor>& in) {
        Tensor loss = nn::mse_loss(net(in[0]).reshape({-1}), in[1]);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
    std::vector<Tensor> ps = net.parameters();
    Vec w_before = vals(ps[0]);
    tg::Stats s0 = tg::stats();
    Tensor first = step({fv(xs, {8, 2}), fv(ys)});
    tg::Stats s1 = tg::stats();
    CHECK(s1.compiles - s0.compiles <= 1);
    CHECK_EQ(prepared(s1) - prepared(s0), int64_t(1));   // one program prepared ...
    CHECK_EQ(s1.programs_run - s0.programs_run, int64_t(1));   // ... and run once
    CHECK_EQ(step.replays(), int64_t(0));
    CHECK(first.realized());
    CHECK_EQ(first.shape(), Shape{});
    double l0 = first.item();
    CHECK(vals(ps[0]) != w_before);   // the update ran
    Vec last_w = vals(ps[0]);
    double last_loss = l0;
    bool losses_differ = false;
    for (int k = 1; k <= 4; k++) {
        std::vector<float> nx = randf(8 * 2, 210 + uint64_t(k)), ny(8);
        for (size_t i = 0; i < 8; i++) ny[i] = nx[2 * i] > 0 ? 1.0f : -1.0f;
        Tensor X = fv(nx, {8, 2}), Y = fv(ny);
        tg::Stats a = tg::stats();
        Tensor l = step({X, Y});
        tg::Stats b = tg::stats();
        CHECK_EQ(b.compiles, a.compiles);
        CHECK_EQ(prepared(b), prepared(a));   // no program prepared: no graph was lowered
        CHECK_EQ(b.programs_run, a.programs_run + 1);
        CHECK_EQ(step.replays(), int64_t(k));
        CHECK(l.realized());
        // the replay computed the loss of the new data with the current parameters
        double lk = l.item();
        losses_differ = losses_differ || lk != last_loss;
        last_loss = lk;
        Vec w = vals(ps[0]);
        CHECK(w != last_w);
        last_w = w;
    }
    CHECK(losses_differ);
    // the returned tensor does not alias the program's buffer: old results keep their values
    CHECK_EQ(first.item(), l0);
}

namespace {
// The jitted step of loss = Σ p·in[0]: each replay moves p by -lr·in[0]
tg::Jit jitted_dot_step(Tensor p, optim::Optimizer& opt) {
    return tg::Jit([p, &opt](const std::vector<Tensor>& in) {
        Tensor loss = (p * in[0]).sum();
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
}
}  // namespace

TEST(jit_replays_see_set_lr) {
    // loss = Σ c·p under the jit: each replay moves p by -lr·c with the lr of that moment
    std::vector<float> c = {2, -1, 0.5f};
    Tensor p = fv({1, 1, 1}).requires_grad();
    optim::SGD opt({p}, 0.1);
    tg::Jit step = jitted_dot_step(p, opt);
    step({fv(c)});
    CHECK_ALL_NEAR(vals(p), (Vec{0.8, 1.1, 0.95}), F32);
    tg::Stats before = tg::stats();
    opt.set_lr(0);
    step({fv(c)});
    CHECK_ALL_NEAR(vals(p), (Vec{0.8, 1.1, 0.95}), F32);
    opt.set_lr(1);
    double l = step({fv(c)}).item();
    CHECK_NEAR(l, 2 * 0.8 - 1.1 + 0.5 * 0.95, F32);   // the loss before this update
    CHECK_ALL_NEAR(vals(p), (Vec{-1.2, 2.1, 0.45}), F32);
    tg::Stats after = tg::stats();
    CHECK_EQ(prepared(after), prepared(before));
    CHECK_EQ(step.replays(), int64_t(2));
}

// A step that takes rows of its input (a slice, which outside a trace is a view into the
// input's buffer) reads the rows of each call's input when replayed, not the traced input's.
TEST(jit_replays_read_the_rows_a_step_slices_from_its_input) {
    Tensor p = fv({1, 2}).requires_grad();
    optim::SGD opt({p}, 0.25);
    tg::Jit step([&](const std::vector<Tensor>& in) {
        Tensor loss = (in[0].slice(0, 1, 3) * p).sum();
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
    std::vector<float> want_p = {1, 2};
    for (int call = 0; call < 3; call++) {
        float a = float(call + 1), b = float(10 * call - 3);
        double want = a * want_p[0] + b * want_p[1];
        CHECK_EQ(step({fv({9, a, b, 9}, {4})}).item(), want);
        want_p = {want_p[0] - 0.25f * a, want_p[1] - 0.25f * b};
        CHECK_EQ(p.to_vector(), want_p);
    }
    CHECK_EQ(step.replays(), int64_t(2));
}

// What the step builds after its optimizer's step reads the updated parameter, as in eager
// mode; what it built before reads the old one
TEST(jit_step_reads_its_own_update_as_eager_does) {
    Tensor eager_p = fv({1, -2, 0.5}).requires_grad(), jitted_p = fv({1, -2, 0.5}).requires_grad();
    optim::SGD eager_opt({eager_p}, 0.1), jitted_opt({jitted_p}, 0.1);
    auto step = [](const Tensor& p, optim::SGD& opt, const Tensor& x) {
        Tensor before = (p * x).sum().square();
        opt.zero_grad();
        before.backward();
        opt.step();
        return tg::stack({before, (p * x).sum().square()}); // the loss before and after
    };
    tg::Jit jitted(
        [&](const std::vector<Tensor>& in) { return step(jitted_p, jitted_opt, in[0]); });
    for (int call = 0; call < 3; call++) {
        Tensor x = fv({0.5f, 1, float(call) - 1});
        Vec eager = vals(step(eager_p, eager_opt, x)), traced = vals(jitted({x}));
        CHECK(eager[1] < eager[0]);
        CHECK(traced == eager);
    }
    CHECK_EQ(jitted.replays(), int64_t(2));
}

TEST(jit_matches_eager_bit_for_bit_sgd_momentum) { check_jit_matches_eager(false); }
TEST(jit_matches_eager_bit_for_bit_adam) { check_jit_matches_eager(true); }

// An optimizer's step runs in the background by default (TG_SYNC=0): step() queues its
// program and returns while it runs (these small steps only with TG_BACKGROUND_MIN_WORK=0).
// Such steps give the bits of steps run at once, reads wait for the step that writes what
// they read, and each step's loss keeps its value.
namespace {
struct EagerRun {
    std::vector<std::vector<float>> params;
    std::vector<float> losses;
    int64_t background_runs = 0;
};
EagerRun train_eagerly(const char* sync) {
    th::EnvGuard mode("TG_SYNC", sync), small("TG_BACKGROUND_MIN_WORK", "0");
    tg::manual_seed(321);
    nn::Sequential net(nn::Linear(3, 16), nn::Tanh(), nn::Linear(16, 4));
    optim::Adam opt(net.parameters(), 0.05);
    tg::Stats before = tg::stats();
    std::vector<Tensor> losses;
    for (uint64_t s = 0; s < 6; s++) {
        Tensor x = fv(randf(10 * 3, 330 + s), {10, 3});
        Tensor y = Tensor::from_vector(randi(10, 340 + s, 0, 3));
        Tensor loss = nn::cross_entropy(net(x), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        losses.push_back(loss);   // read after the last step
        if (s == 2) opt.set_lr(0.02);   // waits for the steps that read the old rate
    }
    EagerRun out;
    out.background_runs = tg::stats().background_runs - before.background_runs;
    for (const Tensor& l : losses) out.losses.push_back(l.item());
    for (const Tensor& p : net.parameters()) out.params.push_back(p.to_vector());
    return out;
}
}  // namespace

TEST(optimizer_steps_in_the_background_give_the_bits_of_steps_run_at_once) {
    EagerRun at_once = train_eagerly("1"), background = train_eagerly("0");
    CHECK_EQ(at_once.background_runs, int64_t(0));
    // steps go to the background on the CPU (not on CUDA, whose steps are queued anyway)
    bool cpu = tg::detail::default_device().runs_in_background();
    CHECK_EQ(background.background_runs, int64_t(cpu ? 6 : 0));
    CHECK_EQ(background.losses, at_once.losses);
    CHECK_EQ(background.params, at_once.params);
    CHECK(at_once.losses.front() != at_once.losses.back());   // it did train
    // a jitted step after background steps reads the parameters they wrote
    Tensor p = fv({1, 2, 3}).requires_grad();
    optim::SGD opt({p}, 0.5);
    (p * p).sum().backward();
    opt.step();   // p = p - 0.5 * 2p = 0
    tg::Jit step = jitted_dot_step(p, opt);
    CHECK_EQ(step({fv({1, 1, 1})}).item(), 0.0);
    CHECK_EQ(p.to_vector(), (std::vector<float>{-0.5f, -0.5f, -0.5f}));
    tg::synchronize();   // nothing left to wait for: returns
    // by default a step of little work runs at once: its hand-over would cost more
    th::EnvGuard mode("TG_SYNC", "0");
    int64_t before = tg::stats().background_runs;
    (p * p).sum().backward();
    opt.step();
    CHECK_EQ(tg::stats().background_runs, before);
}

TEST(jit_rejects_other_shapes_and_reads_while_tracing) {
    tg::manual_seed(220);
    nn::Linear lin(3, 1);
    optim::SGD opt(lin.parameters(), 0.01);
    tg::Jit step([&](const std::vector<Tensor>& in) {
        Tensor loss = lin(in[0]).sum();
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
    step({Tensor::ones({4, 3})});
    CHECK_THROWS(step({Tensor::ones({5, 3})}), "jit", "[5,3]", "[4,3]");
    CHECK_THROWS(step({Tensor::ones({4, 3}, DType::FLOAT64)}), "jit");
    CHECK_THROWS(step({Tensor::ones({4, 3}), Tensor::ones({4, 3})}), "jit");
    CHECK_THROWS(step({}), "jit");
    CHECK_EQ(step.replays(), int64_t(0));
    step({Tensor::ones({4, 3})});   // still usable with the traced shape
    CHECK_EQ(step.replays(), int64_t(1));

    // reading a value while tracing throws, and leaves nothing half-done
    tg::Jit reads([&](const std::vector<Tensor>& in) {
        Tensor loss = lin(in[0]).sum();
        if (loss.item() > 1e30) return loss;
        return loss * 2.0f;
    });
    CHECK_THROWS(reads({Tensor::ones({2, 3})}), "jit");
    tg::Jit reads_vector([&](const std::vector<Tensor>& in) {
        Tensor y = in[0] * 2.0f;
        return y.to_vector().empty() ? y : y + 1.0f;
    });
    CHECK_THROWS(reads_vector({Tensor::ones({2})}), "jit");
    CHECK_EQ((Tensor::arange(3) + 1).to_vector<int>(), (std::vector<int>{1, 2, 3}));   // eager works again
    CHECK_EQ(step.replays(), int64_t(1));
}

// =============================================================================================
// data
// =============================================================================================

TEST(data_moons_shapes_labels_determinism) {
    tg::data::Dataset d = tg::data::moons(100, 0.1, 3);
    CHECK_EQ(d.X.shape(), (Shape{100, 2}));
    CHECK(d.X.dtype() == DType::FLOAT32);
    CHECK_EQ(d.Y.shape(), (Shape{100}));
    Vec y = vals(d.Y);
    int pos = 0, neg = 0;
    for (double v : y) {
        CHECK(v == 1 || v == -1);
        pos += v == 1, neg += v == -1;
    }
    CHECK_EQ(pos, 50);
    CHECK_EQ(neg, 50);
    CHECK(vals(tg::data::moons(100, 0.1, 3).X) == vals(d.X));
    CHECK(vals(tg::data::moons(100, 0.1, 3).Y) == y);
    CHECK(vals(tg::data::moons(100, 0.1, 4).X) != vals(d.X));
    // without noise: label -1 on the unit circle's upper half, +1 on the lower one around (1, 0.5)
    tg::data::Dataset clean = tg::data::moons(40, 0, 0);
    Vec X = vals(clean.X), Y = vals(clean.Y);
    for (size_t i = 0; i < 40; i++) {
        double px = X[2 * i], py = X[2 * i + 1];
        if (Y[i] < 0) {
            CHECK_NEAR(px * px + py * py, 1, 1e-5);
            CHECK(py >= -1e-6);
        } else {
            CHECK_NEAR((px - 1) * (px - 1) + (py - 0.5) * (py - 0.5), 1, 1e-5);
            CHECK(py <= 0.5 + 1e-6);
        }
    }
    // noise moves the points off the circles
    Vec noisy = vals(tg::data::moons(40, 0.1, 0).X);
    double moved = 0;
    for (size_t i = 0; i < noisy.size(); i++) moved += std::fabs(noisy[i] - X[i]);
    CHECK(moved / 80 > 0.03 && moved / 80 < 0.2);
    CHECK_THROWS(tg::data::moons(1), "moons");
}

TEST(data_batches_partition_and_shuffle) {
    std::vector<Tensor> b = tg::data::batches(100, 16, 5);
    CHECK_EQ(b.size(), size_t(6));   // the short tail is dropped
    std::vector<int> all;
    for (const Tensor& t : b) {
        CHECK(t.dtype() == DType::INT32);
        CHECK_EQ(t.shape(), (Shape{16}));
        for (int v : t.to_vector<int>()) all.push_back(v);
    }
    std::set<int> distinct(all.begin(), all.end());
    CHECK_EQ(distinct.size(), all.size());
    CHECK(*distinct.begin() >= 0 && *distinct.rbegin() < 100);
    // an exact multiple: a permutation of 0..n-1
    std::vector<Tensor> full = tg::data::batches(96, 16, 5);
    CHECK_EQ(full.size(), size_t(6));
    std::vector<int> perm;
    for (const Tensor& t : full)
        for (int v : t.to_vector<int>()) perm.push_back(v);
    std::vector<int> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> iota(96);
    for (int i = 0; i < 96; i++) iota[size_t(i)] = i;
    CHECK(sorted == iota);
    CHECK(perm != iota);   // shuffled
    // the seed decides the order
    auto order = [](uint64_t seed) {
        std::vector<int> o;
        for (const Tensor& t : tg::data::batches(96, 16, seed))
            for (int v : t.to_vector<int>()) o.push_back(v);
        return o;
    };
    CHECK(order(5) == perm);
    CHECK(order(6) != perm);
    CHECK(order(7) != order(6));
    CHECK_EQ(tg::data::batches(10, 16, 1).size(), size_t(0));
    CHECK_THROWS(tg::data::batches(10, 0, 1), "batches");
    CHECK_THROWS(tg::data::batches(-5, 4, 1), "batches");   // last: another exception would end the case
}

// =============================================================================================
// plots
// =============================================================================================

namespace {
std::vector<std::string> lines_of(const std::string& s) {
    std::vector<std::string> out;
    std::istringstream in(s);
    std::string line;
    while (std::getline(in, line)) out.push_back(line);
    return out;
}
Tensor score_x0(const Tensor& pts) { return pts.slice(1, 0, 1).reshape({-1}) - 0.5f; }
}  // namespace

TEST(plot_decision_boundary_text) {
    tg::data::Dataset d = tg::data::moons(200, 0.1, 11);
    std::string out = tg::plot::decision_boundary(score_x0, d.X, d.Y, 60, 20);
    CHECK(!out.empty() && out.back() == '\n');
    std::vector<std::string> rows = lines_of(out);
    CHECK_EQ(rows.size(), size_t(20));
    std::string seen;
    for (const std::string& r : rows) {
        CHECK_EQ(r.size(), size_t(60));
        for (char c : r) {
            CHECK(c == '.' || c == '*' || c == '#' || c == '+');
            if (seen.find(c) == std::string::npos) seen += c;
        }
    }
    for (char c : std::string(".*#+")) CHECK(seen.find(c) != std::string::npos);
    // score x0 - 0.5: '.' on the left (x small), '*' on the right
    for (const std::string& r : rows) {
        if (r.size() != 60) continue;
        if (r[0] != '#' && r[0] != '+') CHECK_EQ(r[0], '.');
        if (r[59] != '#' && r[59] != '+') CHECK_EQ(r[59], '*');
    }
    // the default size
    CHECK_EQ(lines_of(tg::plot::decision_boundary(score_x0, d.X, d.Y)).size(), size_t(28));
    CHECK_THROWS(tg::plot::decision_boundary(score_x0, Tensor::zeros({5, 3}), Tensor::zeros({5})), "plot");
}

TEST(plot_decision_boundary_svg_file) {
    TempDir tmp;
    std::string dir = tmp.path, path = dir + "/moons.svg";
    tg::data::Dataset d = tg::data::moons(50, 0.1, 12);
    tg::plot::decision_boundary_svg(path, score_x0, d.X, d.Y);
    std::string svg = slurp(path);
    CHECK(svg.rfind("<svg", 0) == 0);
    CHECK(svg.find("</svg>") != std::string::npos);
    size_t circles = 0;
    for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1)) circles++;
    CHECK_EQ(circles, size_t(50));
    CHECK(svg.find("<rect") != std::string::npos);
    CHECK_EQ(dir_entries(dir), (std::vector<std::string>{"moons.svg"}));   // no temporary left
}

TEST(plot_line_chart_lines) {
    std::vector<double> v = {5, 4, 3, 2.5, 2, 1.5, 1};
    std::string chart = tg::plot::line_chart(v, 30, 8);
    std::vector<std::string> rows = lines_of(chart);
    CHECK_EQ(rows.size(), size_t(9));   // 8 rows and the axis
    size_t stars = 0;
    for (size_t r = 0; r < rows.size(); r++)
        for (char c : rows[r]) stars += c == '*';
    CHECK_EQ(stars, size_t(30));   // one per column
    if (rows.size() == 9) {
        CHECK(rows[0].find("5.0000") != std::string::npos);   // the maximum labels the top row
        CHECK(rows[7].find("1.0000") != std::string::npos);   // the minimum the bottom row
        size_t bar = rows[0].find('|');
        CHECK(bar != std::string::npos);
        if (bar != std::string::npos) {
            CHECK_EQ(rows[0].size(), bar + 1 + 30);
            CHECK_EQ(rows[0][bar + 1], '*');                     // the first value is the highest
            CHECK_EQ(rows[7][rows[7].size() - 1], '*');          // the last the lowest
        }
        CHECK(rows[8].find('+') != std::string::npos);
        CHECK_EQ(rows[8].size(), size_t(11 + 1 + 30));
    }
    CHECK_EQ(lines_of(tg::plot::line_chart(v)).size(), size_t(13));
    CHECK_EQ(tg::plot::line_chart({}), std::string());
    CHECK_EQ(lines_of(tg::plot::line_chart({2, 2, 2}, 10, 4)).size(), size_t(5));   // flat: no division by 0
}

// =============================================================================================
// safetensors
// =============================================================================================

TEST(safetensors_round_trip) {
    TempDir tmp;
    std::string dir = tmp.path, path = dir + "/model.safetensors";
    std::vector<float> w = randf(6, 90);
    std::vector<double> f64 = {1.0 / 3, -2.5e-300, 1e300, 0};
    std::vector<int32_t> i32 = {-7, 0, 2147483647, -2147483647 - 1};
    std::map<std::string, Tensor> in = {
        {"layer.weight", fv(w, {2, 3})},
        {"f64", Tensor::from_vector(f64)},
        {"ids", Tensor::from_vector(i32, {2, 2})},
        {"scalar", Tensor::from_vector(std::vector<float>{3.5f}, {})},
        {"lazy", Tensor::arange(5) * 3},                    // realized by save
        {"empty", Tensor::zeros({0, 4})},
        {"mask", Tensor::arange(4) > 1},
        {"quote\"back\\slash\ttab/é", Tensor::ones({1})},   // names are JSON-escaped
    };
    tg::safetensors::save(path, in);
    std::map<std::string, Tensor> out = tg::safetensors::load(path);
    CHECK_EQ(out.size(), in.size());
    for (auto& [name, t] : in) {
        auto it = out.find(name);
        CHECK(it != out.end());
        if (it == out.end()) continue;
        CHECK_EQ(it->second.shape(), t.shape());
        CHECK(it->second.dtype() == t.dtype());
        CHECK(it->second.realized());
        CHECK(it->second.to_vector<double>() == t.to_vector<double>());
    }
    if (out.count("f64")) CHECK(out["f64"].to_vector<double>() == f64);
    if (out.count("ids")) CHECK(out["ids"].to_vector<int32_t>() == i32);
    if (out.count("scalar")) {
        CHECK_EQ(out["scalar"].ndim(), 0);
        CHECK_EQ(out["scalar"].item(), 3.5);
    }
    // a loaded tensor computes like any other
    if (out.count("layer.weight")) CHECK_NEAR((out["layer.weight"] * 2.0f).sum().item(), 2 * (w[0] + w[1] + w[2] + w[3] + w[4] + w[5]), F32);
    // an empty map round-trips too
    tg::safetensors::save(dir + "/empty.safetensors", {});
    CHECK(tg::safetensors::load(dir + "/empty.safetensors").empty());
}

TEST(safetensors_file_follows_the_specification) {
    TempDir tmp;
    std::string dir = tmp.path, path = dir + "/x.safetensors";
    std::vector<float> x = {1.5f, -2.0f, 0.1f};
    std::vector<double> y = {-0.25, 1e-10};
    tg::safetensors::save(path, {{"x", fv(x)}, {"y", Tensor::from_vector(y, {1, 2})}});
    std::string f = slurp(path);
    CHECK(f.size() >= 8);
    if (f.size() < 8) return;
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--) n = (n << 8) | uint8_t(f[size_t(b)]);   // little-endian u64
    CHECK_EQ(f.size(), size_t(8 + n + 12 + 16));
    if (f.size() != 8 + n + 12 + 16) return;
    std::string header = f.substr(8, size_t(n));
    CHECK(header.find("\"dtype\":\"F32\"") != std::string::npos);
    CHECK(header.find("\"dtype\":\"F64\"") != std::string::npos);
    CHECK(header.find("\"shape\"") != std::string::npos);
    CHECK(header.find("\"data_offsets\"") != std::string::npos);
    Json root;
    CHECK(parse_json(header, root));
    CHECK_EQ(root.kind, 'o');
    const Json* jx = root.at("x");
    const Json* jy = root.at("y");
    CHECK(jx && jy);
    if (!jx || !jy) return;
    CHECK(jx->at("dtype") && jx->at("dtype")->text == "F32");
    CHECK(jy->at("dtype") && jy->at("dtype")->text == "F64");
    CHECK_EQ(json_numbers(jx->at("shape")), (Vec{3}));
    CHECK_EQ(json_numbers(jy->at("shape")), (Vec{1, 2}));
    Vec ox = json_numbers(jx->at("data_offsets")), oy = json_numbers(jy->at("data_offsets"));
    CHECK_EQ(ox.size(), size_t(2));
    CHECK_EQ(oy.size(), size_t(2));
    if (ox.size() != 2 || oy.size() != 2) return;
    CHECK_EQ(ox[1] - ox[0], 12.0);
    CHECK_EQ(oy[1] - oy[0], 16.0);
    CHECK((ox[0] == 0 && oy[0] == 12) || (oy[0] == 0 && ox[0] == 16));   // contiguous
    // the data section starts at 8 + N, raw little-endian values
    std::string data = f.substr(size_t(8 + n));
    std::string want_x = le_f32(x[0]) + le_f32(x[1]) + le_f32(x[2]), want_y = le_f64(y[0]) + le_f64(y[1]);
    CHECK(data.substr(size_t(ox[0]), 12) == want_x);
    CHECK(data.substr(size_t(oy[0]), 16) == want_y);
    // an int32 tensor: "I32", two's complement little-endian
    tg::safetensors::save(path, {{"i", Tensor::from_vector(std::vector<int32_t>{-2, 258})}});
    f = slurp(path);
    n = 0;
    for (int b = 7; b >= 0; b--) n = (n << 8) | uint8_t(f[size_t(b)]);
    CHECK(f.substr(8, size_t(n)).find("\"dtype\":\"I32\"") != std::string::npos);
    CHECK(f.size() >= 8 + n && f.substr(size_t(8 + n)) == le_i32(-2) + le_i32(258));
}

TEST(safetensors_loads_files_written_by_hand) {
    TempDir tmp;
    std::string dir = tmp.path;
    // the minimal example: no padding, no metadata
    std::string p1 = dir + "/a.safetensors";
    write_bytes(p1, st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", le_f32(1.25f) + le_f32(-3.5f)));
    std::map<std::string, Tensor> a = tg::safetensors::load(p1);
    CHECK_EQ(a.size(), size_t(1));
    if (a.count("a")) {
        CHECK_EQ(a["a"].shape(), (Shape{2}));
        CHECK(a["a"].dtype() == DType::FLOAT32);
        CHECK_EQ(a["a"].to_vector(), (std::vector<float>{1.25f, -3.5f}));
    }
    // __metadata__, whitespace, space padding, entries listed in another order than their data,
    // a 0-d tensor, F64, I32 and BOOL
    std::string p2 = dir + "/b.safetensors";
    std::string header = "{ \"__metadata__\": {\"format\": \"pt\"},\n"
                         "  \"b\": {\"dtype\": \"I32\", \"shape\": [3], \"data_offsets\": [8, 20]},\n"
                         "  \"s\": {\"dtype\": \"F64\", \"shape\": [], \"data_offsets\": [0, 8]},\n"
                         "  \"m\": {\"dtype\": \"BOOL\", \"shape\": [2, 1], \"data_offsets\": [20, 22]} }";
    header.append((8 - header.size() % 8) % 8, ' ');
    write_bytes(p2, st_file(header, le_f64(-0.75) + le_i32(5) + le_i32(-6) + le_i32(70000) + std::string("\x01\x00", 2)));
    std::map<std::string, Tensor> b = tg::safetensors::load(p2);
    CHECK_EQ(b.size(), size_t(3));
    CHECK(!b.count("__metadata__"));
    if (b.count("b") && b.count("s") && b.count("m")) {
        CHECK(b["b"].dtype() == DType::INT32);
        CHECK_EQ(b["b"].to_vector<int32_t>(), (std::vector<int32_t>{5, -6, 70000}));
        CHECK(b["s"].dtype() == DType::FLOAT64);
        CHECK_EQ(b["s"].shape(), Shape{});
        CHECK_EQ(b["s"].item(), -0.75);
        CHECK(b["m"].dtype() == DType::BOOL);
        CHECK_EQ(b["m"].shape(), (Shape{2, 1}));
        CHECK_EQ(b["m"].to_vector<int>(), (std::vector<int>{1, 0}));
    }
}

TEST(safetensors_rejects_malformed_files) {
    TempDir tmp;
    std::string dir = tmp.path;
    const std::string two_f32 = le_f32(1) + le_f32(2);
    auto path_of = [&](const std::string& name, const std::string& bytes) {
        std::string p = dir + "/" + name + ".safetensors";
        write_bytes(p, bytes);
        return p;
    };
    std::string p;
    p = dir + "/missing.safetensors";
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str());
    p = path_of("short", std::string("\x05\x00\x00", 3));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "short");
    p = path_of("empty", "");
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "short");
    p = path_of("header_too_long", le64(1000) + std::string(R"({"a":1})"));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "header");
    p = path_of("header_huge", le64(~0ull) + std::string(R"({})"));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "header");
    p = path_of("truncated", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", le_f32(1)));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "truncated");
    p = path_of("bad_json", st_file(R"({"a":{"dtype":"F32","shape":[2],)", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "header");
    p = path_of("bad_json2", st_file(R"({"a" {"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "header");
    p = path_of("not_object", st_file(R"([1,2])", ""));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str());
    p = path_of("trailing", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}x)", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str());
    p = path_of("unknown_dtype", st_file(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "dtype", "Q7");
    p = path_of("no_dtype", st_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "dtype");
    p = path_of("offsets_vs_shape", st_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "data_offsets", "'a'");
    p = path_of("offsets_reversed", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "data_offsets");
    p = path_of("negative_size", st_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str());
    // sizes whose byte count overflows 64 bits must not pass as 0 bytes
    p = path_of("overflow", st_file(R"({"a":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})", ""));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str());
    p = path_of("overflow2", st_file(R"({"a":{"dtype":"F32","shape":[4503599627370496,4096],"data_offsets":[0,0]}})", ""));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str());
    p = path_of("overlap", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                   two_f32 + le_f32(3)));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "overlap");
    p = path_of("hole", st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                two_f32 + le_f32(3)));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "hole");
    p = path_of("extra_bytes", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", two_f32 + "zzzz"));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str());
    p = path_of("duplicate_key", st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                         R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "duplicate key 'a'");
    p = path_of("offsets_huge", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "data_offsets", "too large");
    // found by fuzzing: a zero size kept the product of the others from being checked
    p = path_of("zero_then_huge", st_file(R"({"z":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", ""));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", p.c_str(), "too large");
    p = path_of("bool_byte", st_file(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02"));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", "'m'", "bool element 1 is the byte 2");
    // the header is JSON: its numbers and \u escapes are checked
    p = path_of("hex_size", st_file(R"({"a":{"dtype":"F32","shape":[0x2],"data_offsets":[0,8]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", "malformed header");
    p = path_of("zero_padded", st_file(R"({"a":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", "malformed number");
    p = path_of("bad_escape", st_file(R"({"\uZZZZ":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", "bad \\u escape");
    p = path_of("lone_surrogate", st_file(R"({"\ud83d":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", two_f32));
    CHECK_THROWS(tg::safetensors::load(p), "safetensors", "lone high surrogate");
    p = path_of("surrogate_pair", st_file(R"({"\ud83d\ude00":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", two_f32));
    CHECK_EQ(tg::safetensors::load(p).begin()->first, std::string("\xF0\x9F\x98\x80"));   // U+1F600
}

TEST(safetensors_save_is_atomic) {
    TempDir tmp;
    std::string dir = tmp.path, path = dir + "/ckpt.safetensors";
    tg::safetensors::save(path, {{"a", fv({1, 2, 3})}});
    tg::safetensors::save(path, {{"a", fv({4, 5})}, {"b", Tensor::ones({2, 2})}});   // replaces it
    CHECK_EQ(dir_entries(dir), (std::vector<std::string>{"ckpt.safetensors"}));
    std::map<std::string, Tensor> got = tg::safetensors::load(path);
    CHECK_EQ(got.size(), size_t(2));
    if (got.count("a")) CHECK_EQ(got["a"].to_vector(), (std::vector<float>{4, 5}));
    // a failing save (a directory that does not exist) leaves the old file as it was
    std::string bad = dir + "/no/such/dir/x.safetensors";
    std::string names_it = "cannot write " + bad + ":";
    CHECK_THROWS(tg::safetensors::save(bad, {{"a", fv({1})}}), names_it.c_str());
    try {   // the message names the user's path, not the temporary file
        tg::safetensors::save(bad, {{"a", fv({1})}});
    } catch (const tg::Error& e) {
        CHECK(std::string(e.what()).find(".tmp.") == std::string::npos);
    }
    CHECK_EQ(dir_entries(dir), (std::vector<std::string>{"ckpt.safetensors"}));
}

// =============================================================================================
// training smoke test
// =============================================================================================

TEST(training_moons_mlp_sgd_under_jit_fits) {
    const int64_t n = 256, batch = 32;
    tg::manual_seed(1);
    tg::data::Dataset moons = tg::data::moons(n, 0.1, 7);
    nn::Sequential mlp(nn::Linear(2, 16), nn::ReLU(), nn::Linear(16, 16), nn::ReLU(), nn::Linear(16, 1));
    optim::SGD opt(mlp.parameters(), 0.1, 0.9, 1e-4);
    tg::Jit step([&](const std::vector<Tensor>& in) {
        Tensor x = moons.X[in[0]], y = moons.Y[in[0]];
        Tensor loss = nn::hinge_loss(mlp(x).reshape({-1}), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
    const int epochs = 40;
    double first = 0, last = 0;
    for (int epoch = 0; epoch < epochs; epoch++) {
        opt.set_lr(0.05 * (1.0 - 0.9 * epoch / epochs));
        double total = 0;
        std::vector<Tensor> bs = tg::data::batches(n, batch, uint64_t(epoch));
        for (const Tensor& idx : bs) total += step({idx}).item();
        if (epoch == 0) first = total / double(bs.size());
        last = total / double(bs.size());
    }
    CHECK_EQ(step.replays(), int64_t(epochs * (n / batch) - 1));
    CHECK(last < first);
    Tensor scores = mlp(moons.X).reshape({-1});
    double accuracy = ((scores > 0) == (moons.Y > 0)).cast(DType::FLOAT32).mean().item();
    CHECK(accuracy >= 0.95);
    if (accuracy < 0.95) std::fprintf(stderr, "    accuracy %.4f, loss %.4f -> %.4f\n", accuracy, first, last);
}

// Conv2d's parameters: shapes, names and PyTorch's init range (fan_in = in / groups · kernel)
TEST(nn_conv2d_parameters_and_init_range) {
    tg::manual_seed(5);
    nn::Conv2d conv(8, 16, {3, 5}, 1, {1, 2}, 1, 2);
    CHECK_EQ(conv.weight.shape(), (Shape{16, 4, 3, 5}));
    CHECK_EQ(conv.bias.shape(), (Shape{16}));
    nn::Module::Named named = conv.named_parameters();
    CHECK(named.size() == 2 && named[0].first == "weight" && named[1].first == "bias");
    const double bound = 1 / std::sqrt(4.0 * 3 * 5);
    Moments m = moments(vals(conv.weight));
    CHECK(m.min >= -bound && m.max <= bound && m.max > 0.9 * bound && m.min < -0.9 * bound);
    for (double b : vals(conv.bias)) CHECK(b >= -bound && b <= bound);
    CHECK_EQ(conv(Tensor::zeros({2, 8, 6, 7})).shape(), (Shape{2, 16, 6, 7}));   // "same"
    nn::Conv1d line(3, 2, 4, 2, 0, 1, 1, false);
    CHECK_EQ(line.named_parameters().size(), size_t(1));
    CHECK_EQ(line(Tensor::zeros({5, 3, 10})).shape(), (Shape{5, 2, 4}));
    CHECK_EQ(nn::Flatten()(Tensor::zeros({2, 3, 4, 5})).shape(), (Shape{2, 60}));
}

// padding "same" (even kernels: the odd one after) and "valid", and the layers' padding_mode:
// the input padded as F.pad pads it, then convolved without padding
TEST(nn_conv_padding_same_valid_and_modes) {
    namespace F = nn::functional;
    Tensor x = fv(randf(2 * 3 * 7 * 6, 90), {2, 3, 7, 6});
    Tensor w = fv(randf(4 * 3 * 4 * 3, 91), {4, 3, 4, 3}), b = fv(randf(4, 92), {4});
    // kernel 4 along H: 3 in all, 1 before and 2 after; 3 dilated by 2 along W: 2 and 2
    std::vector<int64_t> same_pads = {2, 2, 1, 2};   // F.pad's order: W, then H
    Tensor same = F::conv2d(x, w, b, 1, "same", {1, 2});
    CHECK_EQ(same.shape(), (Shape{2, 4, 7, 6}));
    CHECK_ALL_NEAR(vals(same), vals(F::conv2d(F::pad(x, same_pads), w, b, 1, 0, {1, 2})), 0);
    CHECK_ALL_NEAR(vals(F::conv2d(x, w, b, 1, "valid")), vals(F::conv2d(x, w, b)), 0);
    nn::Conv2d zeros(3, 4, {4, 3}, 1, "same", {1, 2});
    zeros.weight = w, zeros.bias = b;
    CHECK_ALL_NEAR(vals(zeros(x)), vals(same), 0);
    for (const char* mode : {"reflect", "replicate", "circular"}) {
        nn::Conv2d sized(3, 4, {4, 3}, 1, 1, 1, 1, true, mode);
        nn::Conv2d kept(3, 4, {4, 3}, 1, "same", {1, 2}, 1, true, mode);
        sized.weight = kept.weight = w, sized.bias = kept.bias = b;
        CHECK_ALL_NEAR(vals(sized(x)), vals(F::conv2d(F::pad(x, {1, 1, 1, 1}, mode), w, b)), 0);
        CHECK_ALL_NEAR(vals(kept(x)),
                       vals(F::conv2d(F::pad(x, same_pads, mode), w, b, 1, 0, {1, 2})), 0);
    }
    Tensor xg = x.detach().requires_grad();
    F::conv2d(xg, w, b, 1, "same", {1, 2}).square().sum().backward();
    CHECK(xg.grad().shape() == x.shape() && std::isfinite(xg.grad().abs().sum().item()));
    CHECK_THROWS(F::conv2d(x, w, b, 2, "same"), "conv2d", "\"same\" needs stride 1", "[2,2]");
    CHECK_THROWS(F::conv2d(x, w, b, 1, "full"), "conv2d", "\"full\"", "valid", "same");
    CHECK_THROWS(nn::Conv2d(3, 4, 3, 2, "same"), "Conv2d", "\"same\" needs stride 1");
    CHECK_THROWS(nn::Conv2d(3, 4, 3, 1, 1, 1, 1, true, "mirror"), "Conv2d", "padding_mode",
                 "mirror");
    CHECK_THROWS(nn::ConvNd(2, 3, 4, 3, 1, 0, 1, 1, true, true, 0, "reflect"), "ConvTranspose2d",
                 "zeros only");
}

// Conv3d and the 1-d pooling layers compute their functional forms with their own settings
TEST(nn_conv3d_and_1d_pooling_layers_are_their_functionals) {
    namespace F = nn::functional;
    nn::Conv3d cube(2, 4, {3, 1, 2}, 1, {1, 0, 1}, 1, 2);
    CHECK_EQ(cube.weight.shape(), (Shape{4, 1, 3, 1, 2}));
    // in float, as drawn: a weight of exactly -bound is float(-bound), a little past the double
    const double bound = double(float(1 / std::sqrt(3.0 * 1 * 2)));
    for (double w : vals(cube.weight)) CHECK(w >= -bound && w <= bound);
    Tensor x = fv(randf(2 * 2 * 4 * 3 * 5, 80), {2, 2, 4, 3, 5});
    Tensor want = F::conv3d(x, cube.weight, cube.bias, 1, {1, 0, 1}, 1, 2);
    CHECK_EQ(cube(x).shape(), (Shape{2, 4, 4, 3, 6}));
    CHECK_ALL_NEAR(vals(cube(x)), vals(want), 0);
    Tensor seq = fv(randf(2 * 3 * 9, 81), {2, 3, 9});
    CHECK_ALL_NEAR(vals(nn::MaxPool1d(3, 2, 1)(seq)), vals(F::max_pool1d(seq, 3, 2, 1)), 0);
    CHECK_ALL_NEAR(vals(nn::AvgPool1d(2, {}, 1, false)(seq)),
                   vals(F::avg_pool1d(seq, 2, {}, 1, false)), 0);
    CHECK_ALL_NEAR(vals(nn::AdaptiveAvgPool1d(4)(seq)), vals(F::adaptive_avg_pool1d(seq, 4)), 0);
    CHECK_EQ(nn::MaxPool1d(3)(seq).shape(), (Shape{2, 3, 3}));
    CHECK_EQ(nn::AdaptiveAvgPool2d(1)(fv(randf(24, 82), {1, 2, 3, 4})).shape(),
             (Shape{1, 2, 1, 1}));
    CHECK_THROWS(nn::ConvTranspose<4>(2, 2, 3), "ConvTranspose4d", "not offered");
}

// A small convolutional network learns which half of an 8 x 8 image holds a bright 2 x 2 spot,
// jitted: Conv2d, ReLU, MaxPool2d, AvgPool2d, Flatten, Linear.
namespace {
// 8 x 8 images of noise with a 2 x 2 bright spot, in the left half (class 0) or the right (1)
struct Spots {
    Tensor images, classes;
};
Spots spot_images(int64_t n) {
    std::vector<float> pixels(size_t(n) * 64);
    std::vector<int64_t> labels(static_cast<size_t>(n));
    th::Lcg rng(11);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t p = 0; p < 64; p++) pixels[size_t(i * 64 + p)] = float(rng.next()) * 0.3f;
        int64_t row = int64_t(rng.next() * 7), col = int64_t(rng.next() * 3);
        labels[size_t(i)] = i % 2;
        if (i % 2) col += 4;   // the right half
        for (int64_t a = 0; a < 2; a++)
            for (int64_t b = 0; b < 2; b++) pixels[size_t(i * 64 + (row + a) * 8 + col + b)] = 1;
    }
    return {Tensor::from_vector(pixels, {n, 1, 8, 8}), Tensor::from_vector(labels, {n})};
}
// trains net for 41 jitted Adam steps on the spots; the losses of the first and last
double train_on_spots(nn::Module& net, const Spots& data, double* last) {
    optim::Adam opt(net.parameters(), 0.05);
    tg::Jit step([&](const std::vector<Tensor>& in) {
        Tensor loss = nn::cross_entropy(net(in[0]), in[1]);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
    double first = step({data.images, data.classes}).item();
    for (int i = 0; i < 40; i++) *last = step({data.images, data.classes}).item();
    CHECK_EQ(step.replays(), int64_t(40));
    return first;
}
}  // namespace

TEST(training_cnn_under_jit_finds_the_spot) {
    const int64_t n = 64;
    Spots data = spot_images(n);
    Tensor images = data.images, classes = data.classes;
    tg::manual_seed(3);
    nn::Sequential cnn(nn::Conv2d(1, 4, 3, 1, 1), nn::ReLU(), nn::MaxPool2d(2),
                       nn::AvgPool2d(2), nn::Flatten(), nn::Linear(4 * 2 * 2, 2));
    double last = 0, first = train_on_spots(cnn, data, &last);
    Tensor predicted = cnn(images).argmax(1);
    double accuracy = (predicted == classes).cast(DType::FLOAT32).mean().item();
    CHECK(last < 0.5 * first);
    CHECK(accuracy >= 0.95);
    if (accuracy < 0.95 || last >= 0.5 * first)
        std::fprintf(stderr, "    accuracy %.4f, loss %.4f -> %.4f\n", accuracy, first, last);
}

// the same with batch normalization (classifying in eval(), with its running statistics),
// SiLU and adaptive pooling into the two halves
TEST(training_cnn_with_batch_norm_under_jit_finds_the_spot) {
    Spots data = spot_images(64);
    tg::manual_seed(4);
    nn::Sequential cnn(nn::Conv2d(1, 4, 3, 1, 1), nn::BatchNorm2d(4), nn::SiLU(),
                       nn::AdaptiveAvgPool2d({1, 2}), nn::Flatten(), nn::Linear(8, 2));
    double last = 0, first = train_on_spots(cnn, data, &last);
    auto& bn = cnn.at<nn::BatchNorm2d>(1);
    CHECK_EQ(bn.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{41});
    cnn.eval();
    double accuracy = (cnn(data.images).argmax(1) == data.classes).cast(DType::FLOAT32).mean().item();
    CHECK(last < 0.5 * first);
    CHECK(accuracy >= 0.95);
    if (accuracy < 0.95 || last >= 0.5 * first)
        std::fprintf(stderr, "    accuracy %.4f, loss %.4f -> %.4f\n", accuracy, first, last);
}

// ---- transformers: the GPT of tests/data/make_gpt_tiny.py ----------------------------------
namespace {
const int64_t GV = 11, GCTX = 8, GD = 16, GHEADS = 2, GLAYERS = 2, GSTEPS = 8;
const double GLR = 1e-2, GMIN_LR = 1e-3, GWD = 0.01, GCLIP = 0.5;
const int64_t GWARMUP = 3;

// a model of our own: its children give the names PyTorch's module gives its parameters
struct TinyGPT : nn::Module {
    nn::Embedding tok{GV, GD}, pos{GCTX, GD};
    nn::ModuleList blocks;
    nn::LayerNorm lnf{GD};
    nn::Linear head{GD, GV, false};
    TinyGPT() {
        for (int64_t l = 0; l < GLAYERS; l++) blocks.append(nn::TransformerBlock(GD, GHEADS));
    }
    std::vector<std::pair<std::string, nn::Module*>> children() override {
        return {{"tok", &tok}, {"pos", &pos}, {"blocks", &blocks}, {"lnf", &lnf}, {"head", &head}};
    }
    Tensor forward(const Tensor& idx) override {
        Tensor x = tok(idx) + pos(Tensor::arange(idx.size(1)));
        for (size_t i = 0; i < blocks.size(); i++) x = blocks.at<nn::TransformerBlock>(i)(x);
        return head(lnf(x));
    }
    Tensor loss(const Tensor& seq) {
        Tensor logits = (*this)(seq.slice(1, 0, GCTX));
        return nn::cross_entropy(logits.reshape({-1, GV}), seq.slice(1, 1, GCTX + 1).reshape({-1}));
    }
};
const char* GPT_WEIGHTS = "tests/data/gpt_tiny_weights.safetensors";
const char* GPT_RUN = "tests/data/gpt_tiny_run.safetensors";
}  // namespace

// Loaded from PyTorch's initial weights and trained on its batches with AdamW, the schedule
// and clipping, the losses and gradient norms are PyTorch's within float32 rounding.
TEST(training_gpt_matches_pytorch) {
    TinyGPT model;
    std::map<std::string, Tensor> weights = tg::safetensors::load(GPT_WEIGHTS);
    std::vector<std::string> names;
    for (auto& [name, t] : model.named_parameters()) names.push_back(name);
    CHECK_EQ(names.size(), weights.size());
    CHECK(names[0] == "tok.weight" && names[2] == "blocks.0.ln1.weight");
    CHECK(std::find(names.begin(), names.end(), "blocks.1.attn.qkv.weight") != names.end());
    CHECK(std::find(names.begin(), names.end(), "blocks.1.mlp.2.bias") != names.end());
    model.load_state_dict(weights);
    CHECK_ALL_NEAR(vals(model.blocks.at<nn::TransformerBlock>(1).attn.proj.weight),
                   vals(weights.at("blocks.1.attn.proj.weight")), 0);
    std::map<std::string, Tensor> run = tg::safetensors::load(GPT_RUN);
    Tensor batches = run.at("batches");
    Vec losses = vals(run.at("losses")), norms = vals(run.at("norms"));
    optim::AdamW opt(model.parameters(), GLR, 0.9, 0.999, 1e-8, GWD);
    opt.schedule = optim::warmup_cosine(GLR, GWARMUP, GSTEPS, GMIN_LR);
    for (int64_t t = 0; t < GSTEPS; t++) {
        Tensor loss = model.loss(batches[t]);
        opt.zero_grad();
        loss.backward();
        Tensor norm = nn::clip_grad_norm_(model.parameters(), GCLIP);
        opt.step();
        CHECK_NEAR(loss.item(), losses[size_t(t)], 1e-6);   // seen: 0 to 2.4e-7
        CHECK_NEAR(norm.item(), norms[size_t(t)], 1e-5);
    }
    CHECK_EQ(opt.t.item(), double(GSTEPS));
}

// state_dict through safetensors: the names and values come back; a wrong name or shape is
// refused before anything is written
TEST(training_state_dict_round_trips_and_checks) {
    char dir[] = "/tmp/tg-state-XXXXXX";
    CHECK(mkdtemp(dir) != nullptr);
    std::string path = std::string(dir) + "/model.safetensors";
    tg::manual_seed(3);
    TinyGPT a;
    tg::safetensors::save(path, a.state_dict());
    tg::manual_seed(4);
    TinyGPT b;
    CHECK(vals(a.head.weight) != vals(b.head.weight));
    b.load_state_dict(tg::safetensors::load(path));
    for (auto& [name, t] : a.state_dict()) CHECK_ALL_NEAR(vals(b.state_dict().at(name)), vals(t), 0);
    std::map<std::string, Tensor> state = a.state_dict();
    Vec before = vals(b.tok.weight);
    state["tok.weight"] = Tensor::zeros({3, 3});
    CHECK_THROWS(b.load_state_dict(state), "load_state_dict", "tok.weight", "[11,16]", "[3,3]");
    state = a.state_dict();
    state.erase("lnf.bias");
    state["extra"] = Tensor::zeros({1});
    CHECK_THROWS(b.load_state_dict(state), "load_state_dict", "missing", "lnf.bias", "extra");
    CHECK_ALL_NEAR(vals(b.tok.weight), before, 0);   // nothing was written
    b.load_state_dict(state, false);                  // not strict: the rest loads
    nn::Linear lin(2, 3);
    CHECK_THROWS(tg::optim::SGD(lin.parameters(), 0.1).load_state_dict({}), "optimizer",
                 "missing");
    std::system(("rm -rf " + std::string(dir)).c_str());
}

// A run saved after 3 steps (model, optimizer, rng) and resumed goes on bit for bit as the run
// that did not stop, in a jitted step with a schedule and clipping
TEST(training_checkpoint_resumes_bit_identically) {
    std::map<std::string, Tensor> run = tg::safetensors::load(GPT_RUN);
    Tensor batches = run.at("batches");
    auto train = [&](TinyGPT& model, optim::AdamW& opt, int64_t from, int64_t to) {
        tg::Jit step([&](const std::vector<Tensor>& in) {
            Tensor loss = model.loss(in[0]);
            opt.zero_grad();
            loss.backward();
            nn::clip_grad_norm_(model.parameters(), GCLIP);
            opt.step();
            return loss;
        });
        Vec losses;
        for (int64_t t = from; t < to; t++) losses.push_back(step({batches[t].contiguous()}).item());
        return losses;
    };
    auto make_opt = [&](TinyGPT& m) {
        optim::AdamW opt(m.parameters(), GLR, 0.9, 0.999, 1e-8, GWD);
        opt.schedule = optim::warmup_cosine(GLR, GWARMUP, GSTEPS, GMIN_LR);
        return opt;
    };
    tg::manual_seed(5);
    TinyGPT whole;
    optim::AdamW whole_opt = make_opt(whole);
    Vec all = train(whole, whole_opt, 0, GSTEPS);

    tg::manual_seed(5);
    TinyGPT first;
    optim::AdamW first_opt = make_opt(first);
    Vec head = train(first, first_opt, 0, 3);
    std::map<std::string, Tensor> ckpt;
    for (auto& [k, v] : first.state_dict()) ckpt["model." + k] = v;
    for (auto& [k, v] : first_opt.state_dict()) ckpt["optim." + k] = v;
    ckpt["rng"] = Tensor::from_vector(std::vector<int64_t>{int64_t(tg::rng_state())}, {});
    char dir[] = "/tmp/tg-ckpt-XXXXXX";
    CHECK(mkdtemp(dir) != nullptr);
    std::string path = std::string(dir) + "/ckpt.safetensors";
    tg::safetensors::save(path, ckpt);

    tg::manual_seed(99);   // another model, then everything from the checkpoint
    TinyGPT resumed;
    optim::AdamW resumed_opt = make_opt(resumed);
    std::map<std::string, Tensor> loaded = tg::safetensors::load(path), m, o;
    for (auto& [k, v] : loaded) {
        if (k.rfind("model.", 0) == 0) m[k.substr(6)] = v;
        if (k.rfind("optim.", 0) == 0) o[k.substr(6)] = v;
    }
    resumed.load_state_dict(m);
    resumed_opt.load_state_dict(o);
    tg::manual_seed(uint64_t(loaded.at("rng").item()));
    Vec tail = train(resumed, resumed_opt, 3, GSTEPS);
    head.insert(head.end(), tail.begin(), tail.end());
    CHECK_EQ(head.size(), all.size());
    for (size_t i = 0; i < all.size(); i++) CHECK_EQ(head[i], all[i]);   // the same bits
    std::system(("rm -rf " + std::string(dir)).c_str());
}

// MultiheadAttention against loops in double over its own weights (biases made nonzero): a
// bool key padding mask and an additive attention mask, the weights averaged over the heads;
// the same with batch_first and without a batch; PyTorch's names; the errors it promises
// A TransformerEncoder (post-norm, ReLU, a final LayerNorm) and a TransformerDecoder
// (pre-norm, GELU) given PyTorch 1.13's weights under PyTorch's names give its outputs and
// gradients (tests/data/make_reference.py; PyTorch in float64, ours in float32)
TEST(nn_transformer_encoder_and_decoder_match_pytorch) {
    Reference ref = read_reference("tests/data/transformer_reference.txt");
    nn::TransformerEncoder encoder(nn::TransformerEncoderLayer(8, 2, 16, 0.0, "relu", 1e-5, true),
                                   2, nn::LayerNorm(8));
    nn::TransformerDecoder decoder(
        nn::TransformerDecoderLayer(8, 2, 16, 0.0, "gelu", 1e-5, true, true), 2);
    // the copies start equal, in tensors of their own
    auto& first = encoder.layers.at<nn::TransformerEncoderLayer>(0);
    auto& second = encoder.layers.at<nn::TransformerEncoderLayer>(1);
    CHECK_ALL_NEAR(vals(first.linear1.weight), vals(second.linear1.weight), 0);
    CHECK(first.linear1.weight.node() != second.linear1.weight.node());
    std::map<std::string, Tensor> encoder_state, decoder_state;
    for (const auto& [name, t] : ref.inputs) {
        if (name.rfind("encoder.", 0) == 0) encoder_state[name.substr(8)] = t;
        if (name.rfind("decoder.", 0) == 0) decoder_state[name.substr(8)] = t;
    }
    CHECK_EQ(encoder_state.size(), size_t(26));
    CHECK_EQ(decoder_state.size(), size_t(36));
    encoder.load_state_dict(encoder_state);   // strict: every name PyTorch's
    decoder.load_state_dict(decoder_state);
    Tensor padding = ref.inputs.at("src_key_padding_mask") != 0;
    Tensor src = ref.inputs.at("src").cast(DType::FLOAT32).requires_grad();
    Tensor tgt = ref.inputs.at("tgt").cast(DType::FLOAT32).requires_grad();
    Tensor memory = encoder.forward(src, Tensor(), padding);
    // tgt_is_causal in place of PyTorch's causal tgt_mask
    Tensor out = decoder.forward(tgt, memory, Tensor(), Tensor(), Tensor(), padding, true);
    check_case("encoder", ref.cases.at("encoder"), memory, {src}, 1e-5);
    check_case("decoder", ref.cases.at("decoder"), out, {src, tgt}, 1e-5);
    // one layer alone, unbatched, with is_causal: as the mask it stands for
    Tensor causal =
        Tensor::from_vector(std::vector<int32_t>{0, 1, 1, 0, 0, 1, 0, 0, 0}, {3, 3}) != 0;
    Tensor x = src.detach().slice(0, 0, 1).squeeze(0).slice(0, 0, 3);
    CHECK_ALL_NEAR(vals(first.forward(x, Tensor(), Tensor(), true)),
                   vals(first.forward(x, causal)), 1e-6);
    // errors
    CHECK_THROWS(nn::TransformerEncoderLayer(8, 2, 16, 0.1, "tanh"), "TransformerEncoderLayer",
                 "tanh");
    CHECK_THROWS(nn::TransformerDecoder(nn::TransformerDecoderLayer(8, 2), 0),
                 "TransformerDecoder", "num_layers", "0");
    CHECK_THROWS(decoder(tgt), "TransformerDecoder", "memory");
    CHECK_THROWS(nn::TransformerEncoderLayer(8, 3), "MultiheadAttention");
}

// nn.Transformer: PyTorch's weights loaded by name, its output and the inputs' gradients;
// the init draws every matrix from xavier_uniform; reseeding draws the same values again
TEST(nn_transformer_matches_pytorch) {
    Reference ref = read_reference("tests/data/transformer_reference.txt");
    nn::Transformer model(8, 2, 1, 1, 16, 0.0, "relu", 1e-5, true);
    size_t counted = 0;
    for (auto& [name, t] : model.named_parameters()) {
        if (t.ndim() < 2) continue;
        counted++;
        double bound = std::sqrt(6.0 / double(t.size(0) + t.size(1)));
        CHECK(t.abs().max().item() <= bound);
        CHECK(t.abs().max().item() > 0.5 * bound);
    }
    CHECK_EQ(counted, size_t(10));   // 4 matrices in the encoder's layer, 6 in the decoder's
    std::vector<uint64_t> seeds = model.seeds;
    Vec before = vals(model.decoder.layers.at<nn::TransformerDecoderLayer>(0).linear2.weight);
    model.reset_parameters(seeds);
    CHECK_ALL_NEAR(vals(model.decoder.layers.at<nn::TransformerDecoderLayer>(0).linear2.weight),
                   before, 0);
    std::map<std::string, Tensor> state;
    for (const auto& [name, t] : ref.inputs)
        if (name.rfind("transformer.", 0) == 0) state[name.substr(12)] = t;
    CHECK_EQ(state.size(), size_t(34));
    model.load_state_dict(state);   // strict: every name PyTorch's
    Tensor padding = ref.inputs.at("src_key_padding_mask") != 0;
    Tensor src = ref.inputs.at("src").cast(DType::FLOAT32).requires_grad();
    Tensor tgt = ref.inputs.at("tgt").cast(DType::FLOAT32).requires_grad();
    Tensor subsequent = nn::Transformer::generate_square_subsequent_mask(4);
    CHECK_ALL_NEAR(vals(subsequent), (Vec{0, -INFINITY, -INFINITY, -INFINITY, 0, 0, -INFINITY,
                                          -INFINITY, 0, 0, 0, -INFINITY, 0, 0, 0, 0}), 0);
    Tensor out = model.forward(src, tgt, Tensor(), subsequent, Tensor(), padding, Tensor(),
                               padding);
    check_case("transformer", ref.cases.at("transformer"), out, {src, tgt}, 1e-5);
    // tgt_is_causal in place of the mask
    CHECK_ALL_NEAR(vals(model.forward(src, tgt, Tensor(), Tensor(), Tensor(), padding, Tensor(),
                                      padding, false, true)), vals(out), 1e-6);
    // errors
    CHECK_THROWS(model(src), "Transformer", "src and tgt");
    CHECK_THROWS(model.forward(src, tgt.slice(0, 0, 1)), "Transformer", "[2,5,8]", "[1,4,8]",
                 "one batch size");
    CHECK_THROWS(model.reset_parameters({1, 2}), "Transformer", "seeds");
    CHECK_THROWS(nn::Transformer::generate_square_subsequent_mask(-1), "below 0");
}

TEST(nn_multihead_attention) {
    const int64_t E = 8, H = 2, D = 4, N = 2, L = 3, S = 4;
    nn::MultiheadAttention mha(E, H);
    // PyTorch's init: in_proj_weight Xavier uniform (fan in E, out 3E), the biases zeros
    CHECK(mha.in_proj_weight.abs().max().item() <= std::sqrt(6.0 / double(4 * E)));
    CHECK(mha.in_proj_weight.abs().max().item() > 0.5 * std::sqrt(6.0 / double(4 * E)));
    CHECK_EQ(mha.in_proj_bias.abs().sum().item() + mha.out_proj.bias.abs().sum().item(), 0.0);
    mha.in_proj_bias = fv(randf(size_t(3 * E), 60)).requires_grad();
    mha.out_proj.bias = fv(randf(size_t(E), 61)).requires_grad();
    std::vector<float> qv = randf(size_t(L * N * E), 62), kv = randf(size_t(S * N * E), 63),
                       vv = randf(size_t(S * N * E), 64), addv = randf(size_t(L * S), 65);
    std::vector<int32_t> padv = {0, 0, 1, 0, 0, 1, 0, 1};   // [N, S]: keys left out
    Tensor pad = Tensor::from_vector(padv, {N, S}) != 0, add = fv(addv, {L, S});
    auto [out, weights] = mha.forward(fv(qv, {L, N, E}), fv(kv, {S, N, E}), fv(vv, {S, N, E}),
                                      pad, true, add);
    CHECK(out.shape() == Shape({L, N, E}) && weights.shape() == Shape({N, L, S}));
    Vec W = vals(mha.in_proj_weight), B = vals(mha.in_proj_bias);
    Vec Wo = vals(mha.out_proj.weight), Bo = vals(mha.out_proj.bias);
    // row t of input [T, N, E] at batch n, projected by part (0 q, 1 k, 2 v) of in_proj
    auto project = [&](const std::vector<float>& x, int64_t t, int64_t n, int part) {
        Vec y(size_t(E), 0.0);
        for (int64_t o = 0; o < E; o++) {
            double acc = B[size_t(part * E + o)];
            for (int64_t i = 0; i < E; i++)
                acc += W[size_t((part * E + o) * E + i)] * x[size_t((t * N + n) * E + i)];
            y[size_t(o)] = acc;
        }
        return y;
    };
    Vec want_out(size_t(L * N * E)), want_weights(size_t(N * L * S), 0.0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t l = 0; l < L; l++) {
            Vec q = project(qv, l, n, 0), mixed(size_t(E), 0.0);
            for (int64_t h = 0; h < H; h++) {
                Vec w(size_t(S), 0.0);
                double top = -INFINITY, total = 0;
                for (int64_t j = 0; j < S; j++) {
                    Vec k = project(kv, j, n, 1);
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += q[size_t(h * D + d)] * k[size_t(h * D + d)];
                    w[size_t(j)] = padv[size_t(n * S + j)] ? -INFINITY
                                                           : dot / 2 + addv[size_t(l * S + j)];
                    top = std::max(top, w[size_t(j)]);
                }
                for (double& e : w) total += e = std::exp(e - top);
                for (int64_t j = 0; j < S; j++) {
                    Vec v = project(vv, j, n, 2);
                    want_weights[size_t((n * L + l) * S + j)] += w[size_t(j)] / total / double(H);
                    for (int64_t d = 0; d < D; d++)
                        mixed[size_t(h * D + d)] += w[size_t(j)] / total * v[size_t(h * D + d)];
                }
            }
            for (int64_t o = 0; o < E; o++) {
                double acc = Bo[size_t(o)];
                for (int64_t i = 0; i < E; i++) acc += Wo[size_t(o * E + i)] * mixed[size_t(i)];
                want_out[size_t((l * N + n) * E + o)] = acc;
            }
        }
    CHECK_ALL_NEAR(vals(out), want_out, 1e-5);
    CHECK_ALL_NEAR(vals(weights), want_weights, 1e-6);
    // batch first, and one batch without its axis, give the same values
    nn::MultiheadAttention first(E, H, 0, true, true);
    first.load_state_dict(mha.state_dict());
    Tensor q1 = fv(qv, {L, N, E}).transpose(0, 1), k1 = fv(kv, {S, N, E}).transpose(0, 1);
    Tensor v1 = fv(vv, {S, N, E}).transpose(0, 1);
    CHECK_ALL_NEAR(vals(first.forward(q1, k1, v1, pad, false, add).output.transpose(0, 1)),
                   want_out, 1e-5);
    auto alone = mha.forward(q1[1], k1[1], v1[1], pad[1], true, add, false);
    CHECK(alone.weights.shape() == Shape({H, L, S}));
    CHECK_ALL_NEAR(vals(alone.output), vals(out.slice(1, 1, 2).squeeze(1)), 1e-6);
    // PyTorch's names; gradients reach the projections
    std::vector<std::string> names;
    for (auto& [name, t] : mha.state_dict()) names.push_back(name);
    CHECK(names == (std::vector<std::string>{"in_proj_bias", "in_proj_weight", "out_proj.bias",
                                             "out_proj.weight"}));
    mha(fv(qv, {L, N, E})).square().sum().backward();
    CHECK(mha.in_proj_weight.grad().defined() && mha.out_proj.weight.grad().defined());
    CHECK_THROWS(nn::MultiheadAttention(8, 3), "MultiheadAttention", "8", "3");
    CHECK_THROWS(mha.forward(fv(qv, {L, N, E}), fv(kv, {S, N, E}).slice(2, 0, 4), fv(vv, {S, N, E})),
                 "MultiheadAttention", "[4,2,4]");
    CHECK_THROWS(mha.forward(fv(qv, {L, N, E}), fv(kv, {S, N, E}), fv(vv, {S, N, E}), Tensor(),
                             true, add.transpose(0, 1)),
                 "MultiheadAttention", "attn_mask", "[4,3]", "[3,4]");
    CHECK_THROWS(mha.forward(fv(qv, {L, N, E}), fv(kv, {S, N, E}), fv(vv, {S, N, E}),
                             pad.cast(tg::DType::INT32)),
                 "key_padding_mask", "int32");
}

// Keys of kdim and values of vdim features, bias_k and bias_v, and zero attention: as an
// E-wide attention (checked against loops above) whose key and value projections are the
// identity, given the keys and values the layer's own weights make, then bias_k and bias_v,
// then zeros (each less in_proj_bias, which the identity adds back), with masks that allow
// the two extra keys
TEST(nn_multihead_attention_kdim_vdim_bias_kv_zero_attn) {
    const int64_t E = 8, H = 2, N = 2, L = 3, S = 4, KD = 6, VD = 5;
    nn::MultiheadAttention mha(E, H, 0, true, false, true, true, KD, VD);
    CHECK(!mha.in_proj_weight.defined());
    CHECK(mha.q_proj_weight.shape() == Shape({E, E}) && mha.k_proj_weight.shape() == Shape({E, KD}) &&
          mha.v_proj_weight.shape() == Shape({E, VD}));
    CHECK(mha.bias_k.shape() == Shape({1, 1, E}) && mha.bias_v.shape() == Shape({1, 1, E}));
    CHECK(mha.k_proj_weight.abs().max().item() <= std::sqrt(6.0 / double(KD + E)));   // Xavier
    std::vector<std::string> names;
    for (auto& [name, t] : mha.state_dict()) names.push_back(name);
    CHECK(names == (std::vector<std::string>{"bias_k", "bias_v", "in_proj_bias", "k_proj_weight",
                                             "out_proj.bias", "out_proj.weight", "q_proj_weight",
                                             "v_proj_weight"}));
    mha.in_proj_bias = fv(randf(size_t(3 * E), 70)).requires_grad();
    mha.out_proj.bias = fv(randf(size_t(E), 71)).requires_grad();
    Tensor q = fv(randf(size_t(L * N * E), 72), {L, N, E}), k = fv(randf(size_t(S * N * KD), 73), {S, N, KD});
    Tensor v = fv(randf(size_t(S * N * VD), 74), {S, N, VD}), add = fv(randf(size_t(L * S), 75), {L, S});
    std::vector<int32_t> padv = {0, 0, 1, 0, 0, 1, 0, 1};
    Tensor pad = Tensor::from_vector(padv, {N, S}) != 0;
    auto [out, weights] = mha.forward(q, k, v, pad, true, add);
    CHECK(out.shape() == Shape({L, N, E}) && weights.shape() == Shape({N, L, S + 2}));
    nn::MultiheadAttention ref(E, H);
    Tensor I = Tensor::eye(E);
    ref.in_proj_weight = tg::cat({mha.q_proj_weight, I, I}).detach();
    ref.in_proj_bias = mha.in_proj_bias.detach();
    ref.out_proj.weight = mha.out_proj.weight.detach();
    ref.out_proj.bias = mha.out_proj.bias.detach();
    Tensor bk = mha.in_proj_bias.slice(0, E, 2 * E).reshape({1, 1, E}).detach();
    Tensor bv = mha.in_proj_bias.slice(0, 2 * E, 3 * E).reshape({1, 1, E}).detach();
    Tensor keys = tg::cat({k.matmul(mha.k_proj_weight.t()), (mha.bias_k - bk).expand({1, N, E}),
                       (-bk).expand({1, N, E})}).detach();
    Tensor values = tg::cat({v.matmul(mha.v_proj_weight.t()), (mha.bias_v - bv).expand({1, N, E}),
                         (-bv).expand({1, N, E})}).detach();
    Tensor allowed = Tensor::zeros({N, 2}, tg::DType::BOOL);
    auto want = ref.forward(q, keys, values, tg::cat({pad, allowed}, 1), true,
                            tg::cat({add, Tensor::zeros({L, 2})}, 1));
    CHECK_ALL_NEAR(vals(out), vals(want.output), 1e-5);
    CHECK_ALL_NEAR(vals(weights), vals(want.weights), 1e-6);
    out.square().sum().backward();   // gradients reach the new parameters
    tg::realize({mha.k_proj_weight.grad(), mha.bias_k.grad(), mha.bias_v.grad()});
    CHECK(mha.k_proj_weight.grad().abs().sum().item() > 0 && mha.bias_v.grad().abs().sum().item() > 0);
    // zero attention alone, no bias, no masks: in_proj_weight as usual
    nn::MultiheadAttention zero(E, H, 0, false, false, false, true);
    nn::MultiheadAttention plain(E, H, 0, false);
    Tensor wq = zero.in_proj_weight.slice(0, 0, E), wk = zero.in_proj_weight.slice(0, E, 2 * E);
    Tensor wv = zero.in_proj_weight.slice(0, 2 * E, 3 * E);
    plain.in_proj_weight = tg::cat({wq, I, I}).detach();
    plain.out_proj.weight = zero.out_proj.weight.detach();
    Tensor kq = fv(randf(size_t(S * N * E), 76), {S, N, E});
    Tensor none = Tensor::zeros({1, N, E});
    CHECK_ALL_NEAR(vals(zero.forward(q, kq, kq, Tensor(), false).output),
                   vals(plain.forward(q, tg::cat({kq.matmul(wk.t()), none}), tg::cat({kq.matmul(wv.t()), none}),
                                      Tensor(), false).output),
                   1e-5);
    CHECK_THROWS(mha.forward(q, v, v), "MultiheadAttention", "[S, N, 6]", "[4,2,5]");
    CHECK_THROWS(nn::MultiheadAttention(E, H, 0, true, false, false, false, -2), "MultiheadAttention",
                 "kdim -2");
}

// A step of a recurrent cell (RNNBase's mode) in double on one row: the state after it
struct CellState {
    Vec h, c;
};
// (an LSTM's h' projected by w_hr where given)
CellState cell_step(const std::string& mode, const Vec& x, const CellState& s, const Vec& w_ih,
                    const Vec& w_hh, const Vec& b_ih, const Vec& b_hh, const Vec& w_hr = {}) {
    const size_t P = s.h.size(), rows = w_hh.size() / P, in = x.size();
    const size_t H = rows / (mode == "LSTM" ? 4 : mode == "GRU" ? 3 : 1);
    Vec xp(rows), hp(rows);
    for (size_t r = 0; r < rows; r++) {
        xp[r] = b_ih.empty() ? 0 : b_ih[r];
        hp[r] = b_hh.empty() ? 0 : b_hh[r];
        for (size_t i = 0; i < in; i++) xp[r] += w_ih[r * in + i] * x[i];
        for (size_t j = 0; j < P; j++) hp[r] += w_hh[r * P + j] * s.h[j];
    }
    auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
    CellState out{Vec(H), Vec(H)};
    for (size_t j = 0; j < H; j++) {
        if (mode == "LSTM") {
            double i = sigmoid(xp[j] + hp[j]), f = sigmoid(xp[H + j] + hp[H + j]);
            double g = std::tanh(xp[2 * H + j] + hp[2 * H + j]);
            double o = sigmoid(xp[3 * H + j] + hp[3 * H + j]);
            out.c[j] = f * s.c[j] + i * g;
            out.h[j] = o * std::tanh(out.c[j]);
        } else if (mode == "GRU") {
            double r = sigmoid(xp[j] + hp[j]), z = sigmoid(xp[H + j] + hp[H + j]);
            double n = std::tanh(xp[2 * H + j] + r * hp[2 * H + j]);
            out.h[j] = (1 - z) * n + z * s.h[j];
        } else {
            double v = xp[j] + hp[j];
            out.h[j] = mode == "RNN_TANH" ? std::tanh(v) : std::max(v, 0.0);
        }
    }
    if (w_hr.empty()) return out;
    Vec projected(P, 0.0);
    for (size_t p = 0; p < P; p++)
        for (size_t j = 0; j < H; j++) projected[p] += w_hr[p * H + j] * out.h[j];
    out.h = projected;
    return out;
}
Vec row_of(const Vec& v, size_t row, size_t width) {
    return Vec(v.begin() + long(row * width), v.begin() + long((row + 1) * width));
}

// RNN, LSTM and GRU (two layers, both directions; and a one-way RNN of relu without biases)
// against loops in double over their own weights, from given states; the same with batch
// first and without a batch; dropout between layers only; PyTorch's names, shapes and init;
// the cells; and the errors they promise
TEST(nn_rnn_lstm_gru_match_loops) {
    const int64_t L = 4, N = 2, I = 3, H = 5;
    std::vector<float> xv = randf(size_t(L * N * I), 70), hv = randf(size_t(4 * N * H), 71),
                       cv = randf(size_t(4 * N * H), 72);
    Tensor x = fv(xv, {L, N, I});
    nn::RNN rnn(I, H, 2, "tanh", true, false, 0, true), relu(I, H, 1, "relu", false);
    nn::LSTM lstm(I, H, 2, true, false, 0, true);
    nn::GRU gru(I, H, 2, true, false, 0, true);
    nn::LSTM projected(I, H, 2, true, false, 0, true, 2);   // h of 2 features, c of 5
    for (nn::RNNBase* m : std::vector<nn::RNNBase*>{&rnn, &relu, &lstm, &gru, &projected}) {
        const bool is_lstm = m->mode == "LSTM";
        const int64_t dirs = m->bidirectional ? 2 : 1, S = dirs * m->num_layers;
        const int64_t P = m->proj_size ? m->proj_size : H;   // h's features
        Tensor h0 = fv(std::vector<float>(hv.begin(), hv.begin() + S * N * P), {S, N, P});
        Tensor c0 = fv(cv, {4, N, H}).slice(0, 0, S);
        auto [out, h_n, c_n] = m->forward(x, h0, is_lstm ? c0 : Tensor());
        // batch first, and batch 1 without its axis, give the same values; h_0 undefined: zeros
        m->batch_first = true;
        Tensor first = m->forward(x.transpose(0, 1), h0, is_lstm ? c0 : Tensor()).output.transpose(0, 1);
        m->batch_first = false;
        auto alone = m->forward(x.slice(1, 1, 2).squeeze(1), h0.slice(1, 1, 2).squeeze(1),
                                is_lstm ? c0.slice(1, 1, 2).squeeze(1) : Tensor());
        Tensor out_1 = out.slice(1, 1, 2), h_n_1 = h_n.slice(1, 1, 2);
        Tensor from_zeros = (*m)(x), from_zeros_given = m->forward(x, h0 * 0, is_lstm ? c0 * 0 : Tensor()).output;
        // realized together: one program, not one for each tensor read
        std::vector<Tensor> all = {out, h_n, first, alone.output, alone.h_n, out_1, h_n_1, from_zeros,
                                   from_zeros_given};
        if (is_lstm) all.push_back(c_n);
        tg::realize(all);
        CHECK(out.shape() == Shape({L, N, dirs * P}) && h_n.shape() == Shape({S, N, P}));
        CHECK(c_n.defined() == is_lstm);
        // the loops: each layer's input rows [L·N, width], each direction's steps
        Vec input = D(xv), want_h(size_t(S * N * P)), want_c(size_t(S * N * H));
        size_t width = size_t(I);
        for (int64_t layer = 0; layer < m->num_layers; layer++) {
            Vec output(size_t(L * N * dirs * P));
            for (int64_t d = 0; d < dirs; d++) {
                const size_t i = size_t(layer * dirs + d);
                Vec w_ih = vals(m->weight_ih[i]), w_hh = vals(m->weight_hh[i]);
                Vec b_ih = m->has_bias ? vals(m->bias_ih[i]) : Vec();
                Vec b_hh = m->has_bias ? vals(m->bias_hh[i]) : Vec();
                Vec w_hr = m->proj_size ? vals(m->weight_hr[i]) : Vec();
                for (int64_t n = 0; n < N; n++) {
                    CellState s{row_of(D(hv), i * size_t(N) + size_t(n), size_t(P)),
                                row_of(D(cv), i * size_t(N) + size_t(n), size_t(H))};
                    for (int64_t k = 0; k < L; k++) {
                        const int64_t t = d ? L - 1 - k : k;
                        s = cell_step(m->mode, row_of(input, size_t(t * N + n), width), s, w_ih,
                                      w_hh, b_ih, b_hh, w_hr);
                        for (int64_t j = 0; j < P; j++)
                            output[size_t(((t * N + n) * dirs + d) * P + j)] = s.h[size_t(j)];
                    }
                    for (int64_t j = 0; j < P; j++)
                        want_h[(i * size_t(N) + size_t(n)) * size_t(P) + size_t(j)] = s.h[size_t(j)];
                    for (int64_t j = 0; is_lstm && j < H; j++)
                        want_c[(i * size_t(N) + size_t(n)) * size_t(H) + size_t(j)] = s.c[size_t(j)];
                }
            }
            input = output;
            width = size_t(dirs * P);
        }
        CHECK_ALL_NEAR(vals(out), input, F32);
        CHECK_ALL_NEAR(vals(h_n), want_h, F32);
        if (is_lstm) CHECK_ALL_NEAR(vals(c_n), want_c, F32);
        CHECK_ALL_NEAR(vals(first), vals(out), 1e-6);
        CHECK(alone.output.shape() == Shape({L, dirs * P}) && alone.h_n.shape() == Shape({S, P}));
        CHECK_ALL_NEAR(vals(alone.output), vals(out_1), 1e-6);
        CHECK_ALL_NEAR(vals(alone.h_n), vals(h_n_1), 1e-6);
        CHECK_ALL_NEAR(vals(from_zeros), vals(from_zeros_given), 0);
    }
    // PyTorch's names and shapes, its init U(-1/√H, 1/√H)
    std::vector<std::string> names;
    for (auto& [name, t] : lstm.named_parameters()) names.push_back(name + tg::shape_str(t.shape()));
    CHECK(names == (std::vector<std::string>{
                       "weight_ih_l0[20,3]", "weight_hh_l0[20,5]", "bias_ih_l0[20]",
                       "bias_hh_l0[20]", "weight_ih_l0_reverse[20,3]", "weight_hh_l0_reverse[20,5]",
                       "bias_ih_l0_reverse[20]", "bias_hh_l0_reverse[20]", "weight_ih_l1[20,10]",
                       "weight_hh_l1[20,5]", "bias_ih_l1[20]", "bias_hh_l1[20]",
                       "weight_ih_l1_reverse[20,10]", "weight_hh_l1_reverse[20,5]",
                       "bias_ih_l1_reverse[20]", "bias_hh_l1_reverse[20]"}));
    CHECK_EQ(relu.state_dict().size(), size_t(2));
    names.clear();
    for (auto& [name, t] : projected.named_parameters())
        if (name.find("_l1_reverse") != std::string::npos) names.push_back(name + tg::shape_str(t.shape()));
    CHECK(names == (std::vector<std::string>{"weight_ih_l1_reverse[20,4]", "weight_hh_l1_reverse[20,2]",
                                             "bias_ih_l1_reverse[20]", "bias_hh_l1_reverse[20]",
                                             "weight_hr_l1_reverse[2,5]"}));
    CHECK_EQ(gru.weight_hh[3].shape(), Shape({15, 5}));
    double most = 0;
    for (const Tensor& p : gru.parameters()) most = std::max(most, p.abs().max().item());
    CHECK(most <= 1 / std::sqrt(double(H)) && most > 0.5 / std::sqrt(double(H)));
    // dropout acts between the layers, while training: the first layer's states keep
    nn::GRU dropped(I, H, 2, true, false, 0.5, true);
    dropped.load_state_dict(gru.state_dict());
    auto trained = dropped.forward(x, Tensor()), plain = gru.forward(x, Tensor());
    CHECK(vals(trained.output) != vals(plain.output));
    CHECK_ALL_NEAR(vals(trained.h_n.slice(0, 0, 2)), vals(plain.h_n.slice(0, 0, 2)), 0);
    dropped.eval();
    CHECK_ALL_NEAR(vals(dropped(x)), vals(plain.output), 0);
    // the cells: one step from the given state (hx alone: cx zeros)
    nn::RNNCell rnn_cell(I, H);
    nn::LSTMCell lstm_cell(I, H);
    nn::GRUCell gru_cell(I, H, false);
    for (nn::RNNCellBase* cell : std::vector<nn::RNNCellBase*>{&rnn_cell, &lstm_cell, &gru_cell}) {
        auto [h, c] = cell->forward(x[0], fv(hv, {4, N, H})[0]);
        CHECK(h.shape() == Shape({N, H}) && c.defined() == (cell->mode == "LSTM"));
        Vec b_ih = cell->has_bias ? vals(cell->bias_ih) : Vec();
        Vec b_hh = cell->has_bias ? vals(cell->bias_hh) : Vec();
        for (int64_t n = 0; n < N; n++) {
            CellState s = cell_step(cell->mode, row_of(D(xv), size_t(n), size_t(I)),
                                    {row_of(D(hv), size_t(n), size_t(H)), Vec(size_t(H), 0.0)},
                                    vals(cell->weight_ih), vals(cell->weight_hh), b_ih, b_hh);
            CHECK_ALL_NEAR(vals(h[n]), s.h, F32);
            if (c.defined()) CHECK_ALL_NEAR(vals(c[n]), s.c, F32);
        }
        CHECK_ALL_NEAR(vals(cell->forward(x[0][1], fv(hv, {4, N, H})[0][1]).h), vals(h[1]), 1e-6);
    }
    CHECK_EQ(gru_cell.state_dict().size(), size_t(2));
    CHECK(lstm_cell.weight_hh.shape() == Shape({4 * H, H}));
    // gradients reach every parameter (realized here: a gradient left pending when the
    // process ends keeps its graph, which reads the parameter, alive)
    lstm(x).square().sum().backward();
    for (const Tensor& p : lstm.parameters())
        CHECK(p.grad().defined() && std::isfinite(p.grad().abs().sum().item()));
    CHECK_THROWS(nn::RNN(I, H, 1, "sigmoid"), "RNN", "nonlinearity", "sigmoid");
    CHECK_THROWS(nn::GRU(I, H, 0), "GRU", "num_layers", "0");
    CHECK_THROWS(nn::LSTMCell(I, 0), "LSTMCell", "hidden_size 0");
    CHECK_THROWS(nn::LSTM(I, H, 1, true, false, 0, false, H), "LSTM", "proj_size 5", "hidden_size 5");
    CHECK_THROWS(nn::RNNBase("GRU", I, H, 1, true, false, 0, false, 2), "GRU", "proj_size 2");
    CHECK_THROWS(projected.forward(x, fv(hv, {4, N, H})), "LSTM", "h_0", "[4,2,5]", "[4,2,2]");
    CHECK_THROWS(gru(fv(xv, {L, N * I})), "GRU", "[4,6]", "[L, N, 3]");
    CHECK_THROWS(lstm.forward(x, fv(hv, {4, N, H}).slice(0, 0, 2)), "LSTM", "h_0", "[2,2,5]",
                 "[4,2,5]");
    CHECK_THROWS(lstm.forward(x, Tensor(), fv(cv, {4, N, H}).slice(2, 0, 4)), "LSTM", "c_0",
                 "[4,2,4]");
    CHECK_THROWS(gru.forward(x, Tensor(), fv(cv, {4, N, H})), "GRU", "c_0", "cell state");
    CHECK_THROWS(gru_cell.forward(x[0], fv(hv, {4, N, H})[0][0]), "GRUCell", "hx", "[5]",
                 "[2,5]");
    CHECK_THROWS(rnn_cell(x), "RNNCell", "[4,2,3]", "[N, 3]");
}

// Sequences of their own lengths, packed as PyTorch packs them: the layout, the way back, and
// recurrent layers on a packed batch giving what each sequence gives alone (the backward
// direction from its own last step), gradients too; and the errors they promise
TEST(nn_packed_sequences_run_each_its_own_length) {
    const int64_t T = 4, N = 3, I = 2, H = 3;
    std::vector<float> xv = randf(size_t(T * N * I), 80), hv = randf(size_t(4 * N * H), 81),
                       cv = randf(size_t(4 * N * H), 82);
    Tensor x = fv(xv, {T, N, I});
    const std::vector<int64_t> lengths = {2, 4, 3};
    nn::PackedSequence p = nn::pack_padded_sequence(x, lengths, false, false);
    CHECK(p.sorted_indices == (std::vector<int64_t>{1, 2, 0}));
    CHECK(p.unsorted_indices == (std::vector<int64_t>{2, 0, 1}));
    CHECK(p.batch_sizes == (std::vector<int64_t>{3, 3, 2, 1}));
    Vec want;   // step by step, the longest sequence first
    for (auto [t, n] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 1}, {0, 2}, {0, 0}, {1, 1}, {1, 2}, {1, 0}, {2, 1}, {2, 2}, {3, 1}})
        for (int64_t i = 0; i < I; i++) want.push_back(xv[size_t((t * N + n) * I + i)]);
    CHECK(p.data.shape() == Shape({9, I}));
    CHECK_ALL_NEAR(vals(p.data), want, 0);
    CHECK_ALL_NEAR(vals(nn::pack_padded_sequence(x.transpose(0, 1), lengths, true, false).data),
                   want, 0);
    // back: past each length the padding value; batch first, to total_length
    nn::PaddedSequence back = nn::pad_packed_sequence(p, true, -1.0, 5);
    CHECK(back.lengths == lengths);
    CHECK(back.output.shape() == Shape({N, 5, I}));
    Vec padded = vals(back.output), expected;
    for (int64_t n = 0; n < N; n++)
        for (int64_t t = 0; t < 5; t++)
            for (int64_t i = 0; i < I; i++)
                expected.push_back(t < lengths[size_t(n)] ? xv[size_t((t * N + n) * I + i)] : -1.0);
    CHECK_ALL_NEAR(padded, expected, 0);
    // the sequences one by one: pad_sequence pads them with zeros, pack_sequence packs them
    std::vector<Tensor> alone;
    for (int64_t n = 0; n < N; n++) alone.push_back(x.slice(0, 0, lengths[size_t(n)]).slice(1, n, n + 1).squeeze(1));
    CHECK_ALL_NEAR(vals(nn::pad_sequence(alone)), vals(nn::pad_packed_sequence(p).output), 0);
    CHECK(nn::pad_sequence(alone, true).shape() == Shape({N, T, I}));
    CHECK_ALL_NEAR(vals(nn::pack_sequence(alone, false).data), want, 0);
    // layers: each sequence's outputs, h_n and c_n as when it runs alone; 0 past its length
    nn::LSTM lstm(I, H, 2, true, false, 0, true);
    nn::GRU gru(I, H, 2, true, false, 0, true);
    for (nn::RNNBase* m : std::vector<nn::RNNBase*>{&lstm, &gru}) {
        const bool is_lstm = m->mode == "LSTM";
        Tensor h0 = fv(hv, {4, N, H}), c0 = is_lstm ? fv(cv, {4, N, H}) : Tensor();
        nn::RNNBase::PackedOutput run = m->forward(p, h0, c0);
        CHECK(run.output.batch_sizes == p.batch_sizes && run.output.sorted_indices == p.sorted_indices);
        CHECK(run.output.data.shape() == Shape({9, 2 * H}));
        Tensor out = nn::pad_packed_sequence(run.output).output;
        Tensor loss = run.output.data.square().sum() + run.h_n.sum(), loss_alone;
        std::vector<nn::RNNBase::Output> ones;
        for (int64_t n = 0; n < N; n++) {
            ones.push_back(m->forward(alone[size_t(n)].unsqueeze(1), h0.slice(1, n, n + 1),
                                      is_lstm ? c0.slice(1, n, n + 1) : Tensor()));
            Tensor l = ones.back().output.square().sum() + ones.back().h_n.sum();
            loss_alone = n ? loss_alone + l : l;
        }
        std::vector<Tensor> params = m->parameters();
        std::vector<Tensor> g = tg::gradients(loss, params), g_alone = tg::gradients(loss_alone, params);
        // realized together: one program, not one per tensor read
        std::vector<Tensor> all = {out, run.h_n};
        if (is_lstm) all.push_back(run.c_n);
        for (const auto& one : ones) all.insert(all.end(), {one.output, one.h_n, is_lstm ? one.c_n : one.h_n});
        all.insert(all.end(), g.begin(), g.end());
        all.insert(all.end(), g_alone.begin(), g_alone.end());
        tg::realize(all);
        for (int64_t n = 0; n < N; n++) {
            const int64_t len = lengths[size_t(n)];
            const nn::RNNBase::Output& one = ones[size_t(n)];
            Tensor mine = out.slice(1, n, n + 1);
            CHECK_ALL_NEAR(vals(mine.slice(0, 0, len)), vals(one.output), 1e-6);
            if (len < T) CHECK_ALL_NEAR(vals(mine.slice(0, len, T)), Vec(size_t((T - len) * 2 * H), 0.0), 0);
            CHECK_ALL_NEAR(vals(run.h_n.slice(1, n, n + 1)), vals(one.h_n), 1e-6);
            if (is_lstm) CHECK_ALL_NEAR(vals(run.c_n.slice(1, n, n + 1)), vals(one.c_n), 1e-6);
        }
        for (size_t i = 0; i < params.size(); i++) CHECK_ALL_NEAR(vals(g[i]), vals(g_alone[i]), 1e-5);
        if (th::failures()) std::fprintf(stderr, "  in %s\n", m->mode.c_str());
    }
    CHECK_THROWS(nn::pack_padded_sequence(x, lengths), "pack_padded_sequence", "(2, 4, 3)",
                 "must not increase", "enforce_sorted");
    CHECK_THROWS(nn::pack_padded_sequence(x, {2, 0, 3}, false, false), "pack_padded_sequence",
                 "length 0 of sequence 1", "[1, 4]");
    CHECK_THROWS(nn::pack_padded_sequence(x, {2, 2}), "pack_padded_sequence", "[4,3,2]", "2 lengths");
    CHECK_THROWS(nn::pack_padded_sequence(Tensor::zeros({4, 0, 2}), {}), "pack_padded_sequence",
                 "[4,0,2]", "0 lengths");
    CHECK_THROWS(nn::pad_packed_sequence(p, false, 0, 3), "pad_packed_sequence", "total_length 3",
                 "4 steps");
    nn::PackedSequence broken = p;
    broken.batch_sizes = {3, 2, 3, 1};
    CHECK_THROWS(nn::pad_packed_sequence(broken), "pad_packed_sequence", "(3, 2, 3, 1)", "[9,2]");
    broken = p;
    broken.data = p.data.slice(0, 0, 8);
    CHECK_THROWS(nn::pad_packed_sequence(broken), "pad_packed_sequence", "(3, 3, 2, 1)", "[8,2]");
    CHECK_THROWS(nn::pad_sequence({Tensor::zeros({2, 2}), Tensor::zeros({3, 3})}), "pad_sequence",
                 "[2,2], [3,3]");
    CHECK_THROWS(lstm.forward(nn::pack_sequence({Tensor::zeros({2, 5})})), "LSTM", "[2,5]",
                 "[steps, 2]");
    CHECK_THROWS(gru.forward(p, fv(hv, {4, N, H}), fv(cv, {4, N, H})), "GRU", "c_0");
}

// GroupNorm and BatchNorm against loops in double; BatchNorm's running statistics, eval(),
// its steps in a jit, its buffers in state_dict, and the errors it promises
TEST(nn_group_norm_and_batch_norm) {
    const int64_t n = 3, c = 4, hw = 5;
    std::vector<float> xs = randf(size_t(n * c * hw), 40, -2, 3);
    for (size_t i = 0; i < xs.size(); i++) xs[i] = xs[i] * float(1 + (i / hw) % c) + float((i / hw) % c);
    Tensor x = fv(xs, {n, c, hw});
    auto at = [&](int64_t b, int64_t ch, int64_t p) { return double(xs[size_t((b * c + ch) * hw + p)]); };

    // GroupNorm(2 groups of 2 channels) with a weight and a bias
    nn::GroupNorm gn(2, c);
    std::vector<float> w = randf(size_t(c), 41, 0.5, 2), bb = randf(size_t(c), 42);
    gn.weight = fv(w).requires_grad();
    gn.bias = fv(bb).requires_grad();
    Vec want(xs.size());
    for (int64_t b = 0; b < n; b++)
        for (int64_t g = 0; g < 2; g++) {
            double mean = 0, var = 0;
            for (int64_t ch = 2 * g; ch < 2 * g + 2; ch++)
                for (int64_t p = 0; p < hw; p++) mean += at(b, ch, p) / double(2 * hw);
            for (int64_t ch = 2 * g; ch < 2 * g + 2; ch++)
                for (int64_t p = 0; p < hw; p++) var += (at(b, ch, p) - mean) * (at(b, ch, p) - mean) / double(2 * hw);
            for (int64_t ch = 2 * g; ch < 2 * g + 2; ch++)
                for (int64_t p = 0; p < hw; p++)
                    want[size_t((b * c + ch) * hw + p)] =
                        (at(b, ch, p) - mean) / std::sqrt(var + 1e-5) * w[size_t(ch)] + bb[size_t(ch)];
        }
    CHECK_ALL_NEAR(vals(gn(x)), want, F32);
    CHECK_EQ(gn.parameters().size(), size_t(2));
    CHECK_EQ(nn::GroupNorm(2, c, 1e-5, false).parameters().size(), size_t(0));
    CHECK_THROWS(nn::GroupNorm(3, c), "GroupNorm", "4 channels", "3 groups");
    CHECK_THROWS(gn(fv(xs, {n, hw, c})), "GroupNorm", "[3,5,4]", "[N, 4, *]");

    // BatchNorm1d on [N, C, L]: per channel over batch and positions
    nn::BatchNorm1d bn(c, 0.1, 0.25);   // an eps that shows
    Vec mean(size_t(c), 0.0), var(size_t(c), 0.0);
    for (int64_t ch = 0; ch < c; ch++) {
        for (int64_t b = 0; b < n; b++)
            for (int64_t p = 0; p < hw; p++) mean[size_t(ch)] += at(b, ch, p) / double(n * hw);
        for (int64_t b = 0; b < n; b++)
            for (int64_t p = 0; p < hw; p++)
                var[size_t(ch)] += (at(b, ch, p) - mean[size_t(ch)]) * (at(b, ch, p) - mean[size_t(ch)]) / double(n * hw);
    }
    auto normalized = [&](const Vec& m, const Vec& v) {
        Vec out(xs.size());
        for (int64_t b = 0; b < n; b++)
            for (int64_t ch = 0; ch < c; ch++)
                for (int64_t p = 0; p < hw; p++)
                    out[size_t((b * c + ch) * hw + p)] = (at(b, ch, p) - m[size_t(ch)]) / std::sqrt(v[size_t(ch)] + 0.1);
        return out;
    };
    CHECK_ALL_NEAR(vals(bn(x)), normalized(mean, var), F32);
    // running statistics after two steps: r = 0.75 r + 0.25 batch's, the variance unbiased
    bn(x);
    Vec rm(size_t(c), 0.0), rv(size_t(c), 0.0);
    double unbiased = double(n * hw) / double(n * hw - 1);
    for (size_t ch = 0; ch < size_t(c); ch++) {
        rm[ch] = 0.25 * mean[ch] + 0.75 * 0.25 * mean[ch];
        rv[ch] = 0.75 * (0.75 * 1 + 0.25 * var[ch] * unbiased) + 0.25 * var[ch] * unbiased;
    }
    CHECK_ALL_NEAR(vals(bn.running_mean), rm, F32);
    CHECK_ALL_NEAR(vals(bn.running_var), rv, F32);
    CHECK_EQ(bn.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{2});
    bn.eval();   // the running statistics, nothing updated
    CHECK_ALL_NEAR(vals(bn(x)), normalized(rm, rv), F32);
    CHECK_EQ(bn.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{2});
    CHECK_ALL_NEAR(vals(bn.running_mean), rm, F32);
    // momentum std::nullopt: the running statistics are the mean of every batch's
    nn::BatchNorm1d averaged(c, 0.1, std::nullopt);
    Tensor twice = x * 2;
    averaged(x);
    averaged(twice);
    Vec am(size_t(c), 0.0), av(size_t(c), 0.0);
    for (size_t ch = 0; ch < size_t(c); ch++) {
        am[ch] = (mean[ch] + 2 * mean[ch]) / 2;
        av[ch] = (var[ch] + 4 * var[ch]) * unbiased / 2;
    }
    CHECK_ALL_NEAR(vals(averaged.running_mean), am, F32);
    CHECK_ALL_NEAR(vals(averaged.running_var), av, F32);
    // track_running_stats false: no buffers, the batch's statistics in eval() too
    nn::BatchNorm1d untracked(c, 0.1, 0.25, true, false);
    CHECK(!untracked.running_mean.defined() && untracked.state_dict().size() == 2);
    untracked.eval();
    CHECK_ALL_NEAR(vals(untracked(x)), normalized(mean, var), F32);
    // [N, C] too, and gradients reach the input and the affine parameters
    nn::BatchNorm1d flat(c);
    Tensor x2 = fv(randf(size_t(5 * c), 43), {5, c}).requires_grad();
    (flat(x2) * fv(randf(size_t(5 * c), 44), {5, c})).sum().backward();
    CHECK(x2.grad().defined() && flat.weight.grad().defined() && flat.bias.grad().defined());
    CHECK_NEAR(vals(x2.grad().sum(0)).at(1), 0, 1e-5);   // a normalized column's gradient sums to 0

    // jitted training steps update the running statistics as eager ones do
    // (and with momentum std::nullopt, whose share of each batch the replays read from the
    // count)
    nn::BatchNorm2d eager(c), jitted(c), eager_avg(c, 1e-5, std::nullopt),
        jitted_avg(c, 1e-5, std::nullopt);
    Tensor img = fv(randf(size_t(2 * c * 3 * 3), 45, -1, 2), {2, c, 3, 3});
    tg::Jit step([&](const std::vector<Tensor>& in) {
        return jitted(in[0] * 2).sum() + jitted_avg(in[0]).sum();
    });
    for (int i = 0; i < 3; i++) {
        Tensor scaled = img * float(i + 1);
        (eager(scaled * 2).sum() + eager_avg(scaled).sum()).realize();
        step({scaled});
    }
    CHECK(step.replays() == 2);
    CHECK_ALL_NEAR(vals(jitted.running_mean), vals(eager.running_mean), 1e-6);
    CHECK_ALL_NEAR(vals(jitted.running_var), vals(eager.running_var), 1e-6);
    CHECK_ALL_NEAR(vals(jitted_avg.running_mean), vals(eager_avg.running_mean), 1e-6);
    CHECK_ALL_NEAR(vals(jitted_avg.running_mean), vals(img.mean({0, 2, 3}) * 2), 1e-5);
    CHECK_EQ(jitted.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{3});

    // state_dict holds the buffers under PyTorch's names, and load_state_dict restores them
    std::map<std::string, Tensor> state = eager.state_dict();
    std::vector<std::string> names;
    for (auto& [name, t] : state) names.push_back(name);
    CHECK(names == (std::vector<std::string>{"bias", "num_batches_tracked", "running_mean",
                                             "running_var", "weight"}));
    nn::Sequential seq{nn::BatchNorm2d(c)};
    CHECK(seq.state_dict().count("0.running_var") && seq.parameters().size() == 2);
    nn::BatchNorm2d fresh(c);
    fresh.load_state_dict(state);
    CHECK_ALL_NEAR(vals(fresh.running_var), vals(eager.running_var), 0);
    CHECK_EQ(fresh.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{3});

    CHECK_THROWS(bn(fv(xs, {n, c * hw})), "BatchNorm1d", "[3,20]", "[N, 4] or [N, 4, L]");
    CHECK_THROWS(eager(x), "BatchNorm2d", "[3,4,5]", "[N, 4, H, W]");
    nn::BatchNorm1d one(c);
    CHECK_THROWS(one(fv(randf(size_t(c), 46), {1, c})), "batch_norm", "more than 1 value",
                 "[1,4]");
    CHECK_EQ(one.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{0});
    CHECK_THROWS(nn::functional::batch_norm(x, Tensor(), Tensor()), "batch_norm",
                 "running_mean and running_var");
    CHECK_THROWS(nn::functional::batch_norm(x, bn.running_mean, fv({1, 1}), Tensor(), Tensor()),
                 "batch_norm", "running_var", "[2]", "4 channels");
    CHECK_THROWS(nn::functional::group_norm(x, 1, fv({1, 1})), "group_norm", "weight", "[2]");
}

// l1, smooth L1, Huber and NLL losses against loops in double
// Values and gradients (of Σ y·c, c = 0.1·i - 1 over y's elements in order) from PyTorch 1.13's
// F.instance_norm, F.local_response_norm, F.glu, F.softmin and nn.InstanceNorm1d on these
// float64 inputs (the layer's in float32), rounded to 10 places; RMS norm (not in 1.13) from
// its formula, x·rsqrt(mean(x²) + eps)·w, in float64 PyTorch ops.
TEST(nn_rms_instance_local_response_norms_glu_softmin_match_pytorch) {
    namespace F = nn::functional;
    const Vec xs = {0.5, -1.25, 2.0, 1.5, 0.25, -0.75, -2.0, 1.0, 0.5, 0.0, 3.0, -1.5,
                    1.75, -0.5, 0.125, 2.5, -3.0, 0.75, 1.0, -1.0, 0.375, 2.25, -0.25, 1.25};
    const Vec instance_norm_y = {0.02452705376, -0.6798871112, 0.6283106237, 0.4270494337,
        0.9111067216, -0.8666640329, -3.088877476, 2.244434787, 0.3, 0.6086061121, -1.243030561,
        1.534424448, 0.4237201254, -0.5085938357, -0.2496177354, 0.7344914458, -3.238442708,
        1.436084535, 1.747719685, -0.7453615117, 0.8644725487, -1.127783506, 1.5285579,
        -0.06524694329};
    const Vec instance_norm_grad = {-0.05655696676, 0.01936158008, -0.006623612634, 0.04381899932,
        -0.27763942, -0.08230425362, 0.1174204355, 0.2425232381, 0.09258183363, 0.03526925316,
        -0.05290382096, -0.07494726583, -0.07014408218, -0.005697229983, 0.02934709158,
        0.04649422058, -0.09476770871, -0.1119803889, 0.003215888227, 0.2035322094, 0.1583847336,
        0.05564549164, -0.05529405022, -0.1587361751};
    const Vec running_y = {0.165625, 0.70625, -0.659375};
    const Vec running_grad = {1.199869792, 2.111979167, 0.8680989583};
    const Vec instance_eval_y = {0.2526282533, -0.5461738201, 0.9373157449, 0.709086581,
        -0.8278950077, -2.204103244, -3.924363539, 0.2042611693, -0.9443335544, -0.4076937466,
        -3.627532593, 1.202225677, 0.8232011629, -0.2038300744, 0.08145638044, 1.165544909,
        -5.300571775, -0.1397908897, 0.2042611693, -2.548155303, -0.8101736024, -2.822572882,
        -0.1393738426, -1.749293266};
    const Vec instance_eval_grad = {-0.4564583277, -0.4108124949, -0.3651666622, -0.3195208294,
        -0.8257249416, -0.688104118, -0.5504832944, -0.4128624708, 0.2146559231, 0.1073279616, -0,
        -0.1073279616, 0.09129166554, 0.1369374983, 0.1825833311, 0.2282291638, 0.8257249416,
        0.9633457652, 1.100966589, 1.238587412, -1.073279616, -1.180607577, -1.287935539,
        -1.3952635};
    const Vec lrn_y = {0.3595702299, -0.7866805922, 0.91581287, 0.8782185988, 0.176248269,
        -0.4720083553, -0.6659067581, 0.5159260255, 0.3595702299, 0, 1.132185743, -0.8782185988,
        0.6823686216, -0.3457392534, 0.08511672579, 1.184168277, -1.16395124, 0.3796050404,
        0.6777642108, -0.4421501531, 0.1635518727, 1.153384338, -0.1696383449, 0.7642485818};
    const Vec lrn_grad = {-0.6818877474, -0.4073060864, -0.2677680774, -0.2729042803, -0.4014736218,
        -0.2192098729, -0.2317384223, -0.05273673329, -0.1297423205, -0.0704993076, -0.0461012371,
        0.01840011488, 0.1474364385, 0.2129135979, 0.2616484896, 0.1839746727, 0.1543016212,
        0.2484989095, 0.4867563497, 0.5479682215, 0.4495941044, 0.2108043971, 0.826853051,
        0.6755945711};
    const Vec lrn2_y = {0.4999953126, -1.249926763, 1.999700052, 1.49987345, 0.2499970704,
        -0.7499402399, -1.99940021, 0.9998781423, 0.4999941407, 0, 2.998538331, -1.499817213,
        1.74979905, -0.4999953126, 0.1249999268, 2.499414223, -2.998643685, 0.7499771492,
        0.9999619158, -0.9997282112, 0.3748715113, 2.249525507, -0.2499900395, 1.249879896};
    const Vec lrn2_grad = {-0.9999662507, -0.8998066652, -0.799760021, -0.6997891012, -0.5999882815,
        -0.4999390701, -0.3997601259, -0.2999297023, -0.1999939064, -0.09999789068, 0,
        0.09997094403, 0.20016711, 0.3000112488, 0.3999917975, 0.4998172407, 0.5994084716,
        0.6998099932, 0.7999320358, 0.8998097806, 0.9996468251, 1.099350575, 1.199946565,
        1.299722783};
    const Vec glu_y = {0.440398539, -1.021968095, 0.02980073051, -0.548293934, 0.4762870634, 0,
        0.9296164034, -0.46207091, -2.193175736, 0.201706066, 0.1641838122, 1.748924688};
    const Vec glu_grad = {-0.880797078, -0.7358170286, -0.0524967927, 0.1677897586, -0.09536233762,
        -0.511741005, -0.02099871708, 0.103221265, -0.5715444761, -0.0912127619, -0.01355299792, -0,
        -0.2124837493, -0.277242546, -0.1743181825, 0.01051555748, -0.1462117157, -0.02689414214,
        0.1179671599, -0.01474589499, 0, 0.07772998612, 0, 0.03894857707};
    const Vec glu1_y = {0.425976401, -0.471925836, 1.062418747, 1.38621273, 0.01185646829,
        -0.5093840244, -1.462117157, 0.2689414214, 0.2963333, 0, 1.313470497, -1.165949792};
    const Vec glu1_grad = {-0.851952802, -0.3397866019, -0.4249674987, -0.646899274, -0.02845552391,
        -0.3395893496, -0.2924234315, -0.08068242641, -0.11853332, -0.09046505351, 0, 0.07772998612,
        -0.06306461259, 0.2643791762, -0.39844156, -0.07360890237, -0.00677649896, 0.08171062266,
        0.1572895466, -0.05898357997, -0.02414129013, -0, 0, -0.02596571805};
    const Vec softmin_y = {0.3045043424, 0.5282521236, 0.01786798187, 0.04398648029, 0.3909913152,
        0.320401109, 0.9755587549, 0.07252144568, 0.3045043424, 0.1513467674, 0.006573263185,
        0.883492074, 0.008296045289, 0.7405034187, 0.348207185, 0.02659164637, 0.9588924591,
        0.2121577815, 0.1451543504, 0.880594388, 0.03281149561, 0.04733879977, 0.5066384646,
        0.09281396565};
    const Vec softmin_grad = {0.121801737, 0.1316604275, 0.007066467217, 0.03236535062,
        4.340875605e-17, -0.04830435766, -0.004407464679, 0.02435286373, -0.121801737,
        -0.08335606985, -0.002659002538, -0.05671821434, 0.00339977063, 0.09088505947, 0.1613496379,
        0.01134104275, 0.009403072179, -0.05882410712, 0.009198795793, 0.02332600108,
        -0.01280284281, -0.03206095235, -0.1705484337, -0.03466704383};
    const Vec rms_y = {0.1760901813, -1.760901813, -1.40872145, 1.584811631, 0.1054092553,
        -1.264911064, 1.686548085, 1.264911064, 0.1474419562, 0, -1.769303474, -1.326977605,
        0.5654546742, -0.6462339134, -0.08077923917, 2.423377175, -0.8822575465, 0.8822575465,
        -0.5881716977, -0.8822575465, 0.143509462, 3.444227087, 0.1913459493, 1.43509462};
    const Vec rms_grad = {-0.4406349652, -1.046712798, 0.2096701693, -1.004942569, -0.2314318762,
        -0.9079250527, 0.1649069239, -0.2932719726, -0.05192521065, -0.1179535649, 0.0423094309,
        0.06731045824, -0.1360991814, 0.4450896545, -0.272830892, 0.1979289025, -0.1287619122,
        0.8997437321, -0.368799551, 0.6922939847, 0.05166778494, -0.3023003281, -0.6977778142,
        0.3890846923};
    const Vec rms2_y = {0.3450362027, -0.8625905067, 1.380144811, 1.035108608, 0.1725181013,
        -0.517554304, -1.380144811, 0.6900724053, 0.3450362027, 0, 2.070217216, -1.035108608,
        1.146037942, -0.327439412, 0.081859853, 1.63719706, -1.964636472, 0.491159118, 0.654878824,
        -0.654878824, 0.245579559, 1.473477354, -0.163719706, 0.81859853};
    const Vec rms2_grad = {-0.6688495194, -0.6741223796, -0.4671663805, -0.4193820259,
        -0.4034320002, -0.3768705316, -0.3609205059, -0.1645759497, -0.1167915951, -0.06900724053,
        0.1273373156, 0.005338582727, -0.04514400149, 0.2467835804, 0.2493715463, 0.07583974587,
        0.6948468938, 0.382935277, 0.4232631928, 0.6900308081, 0.6171388741, 0.4939270069,
        0.8110145554, 0.7255426381};
    const Vec module_train_y = {0.02452705801, -0.679887116, 0.6283106208, 0.427049458,
        0.9111067057, -0.866664052, -3.088877439, 2.244434834, 0.2999999821, 0.6086061001,
        -1.243030548, 1.534424424, 0.4237201214, -0.5085938573, -0.2496177554, 0.7344914675,
        -3.238442659, 1.436084509, 1.747719526, -0.7453615069, 0.8644726276, -1.127783537,
        1.528558016, -0.06524690986};
    const Vec module_train_grad = {0.08281250298, -0.046875, 0.0703125};
    const Vec module_eval_y = {0.2988913059, -0.5354093313, 1.014006138, 0.7756345272, 0.3522360921,
        -1.507927656, -3.833132267, 1.747358799, -0.1034919024, 0.3660259545, -2.451081276,
        1.774579525, 0.8948203325, -0.1778519154, 0.1201126054, 1.252377748, -5.693295956,
        1.282317877, 1.747358799, -1.972968578, 0.01388756186, -1.746804357, 0.6007848978,
        -0.8077687025};
    const Vec module_unbatched_y = {-0.1509459019, -1.55977428, 1.056621313, 0.6540988684,
        0.5555533171, -0.333332032, -1.444438696, 1.222217321, 0, -0.308606118, 1.54303062,
        -1.234424472};
    const double TOL = 1e-9;
    auto check = [&](auto f, const Vec& want, const Vec& want_grad) {
        Tensor x = Tensor::from_vector(xs, {2, 3, 4}).requires_grad();
        Tensor y = f(x);
        Vec c;
        for (int64_t i = 0; i < y.numel(); i++) c.push_back(0.1 * double(i) - 1);
        Tensor weights = Tensor::from_vector(c, y.shape());
        CHECK_ALL_NEAR(vals(y), want, TOL);
        CHECK_ALL_NEAR(vals(tg::gradients((y * weights).sum(), {x})[0]), want_grad, TOL);
    };
    Tensor w = Tensor::from_vector(Vec{0.5, 2.0, -1.0}), b = Tensor::from_vector(Vec{0.1, -0.2, 0.3});
    Tensor running_mean = Tensor::from_vector(Vec{0.0, 1.0, -1.0});
    Tensor running_var = Tensor::from_vector(Vec{1.0, 2.0, 0.5});
    check([&](const Tensor& x) {
              return F::instance_norm(x, running_mean, running_var, w, b, true, 0.2);
          },
          instance_norm_y, instance_norm_grad);
    CHECK_ALL_NEAR(vals(running_mean), running_y, TOL);   // moved once, by the check's call
    CHECK_ALL_NEAR(vals(running_var), running_grad, TOL);
    check([&](const Tensor& x) {
              return F::instance_norm(x, running_mean, running_var, w, b, false);
          },
          instance_eval_y, instance_eval_grad);
    check([](const Tensor& x) { return F::local_response_norm(x, 3, 0.5, 0.75, 1.5); }, lrn_y,
          lrn_grad);
    check([](const Tensor& x) { return F::local_response_norm(x, 2); }, lrn2_y, lrn2_grad);
    check([](const Tensor& x) { return F::glu(x); }, glu_y, glu_grad);
    check([](const Tensor& x) { return nn::GLU(0).forward(x.reshape({2, 12})); }, glu1_y,
          glu1_grad);
    check([](const Tensor& x) { return nn::Softmin(1).forward(x); }, softmin_y, softmin_grad);
    Tensor w4 = Tensor::from_vector(Vec{0.5, 2.0, -1.0, 1.5});
    check([&](const Tensor& x) { return F::rms_norm(x, {4}, w4); }, rms_y, rms_grad);
    check([](const Tensor& x) { return F::rms_norm(x, {3, 4}, Tensor(), 1e-3); }, rms2_y,
          rms2_grad);

    // the layers: RMSNorm's weight starts as ones; its default eps is float32's spacing at 1
    nn::RMSNorm rms({3, 4});
    CHECK(rms.named_parameters().size() == 1 && rms.weight.shape() == Shape({3, 4}));
    Tensor x32 = Tensor::from_vector(xs, {2, 3, 4}).cast(DType::FLOAT32);
    CHECK_ALL_NEAR(vals(rms(x32)), vals(F::rms_norm(x32, {3, 4}, Tensor(), 0x1p-23)), 1e-6);
    CHECK(nn::RMSNorm(4, 1e-6, false).named_parameters().empty());
    // InstanceNorm1d with affine and running statistics: the batch's statistics while
    // training, the running ones in eval(); unbatched [C, L] too
    nn::InstanceNorm1d in(3, 1e-5, 0.1, true, true);
    in.weight = w.cast(DType::FLOAT32).requires_grad();
    in.bias = b.cast(DType::FLOAT32).requires_grad();
    CHECK_ALL_NEAR(vals(in(x32)), module_train_y, 1e-6);
    CHECK_ALL_NEAR(vals(in.running_mean), module_train_grad, 1e-6);
    CHECK(in.named_buffers().size() == 3 && in.named_parameters().size() == 2);
    in.eval();
    CHECK_ALL_NEAR(vals(in(x32)), module_eval_y, 1e-6);
    CHECK_ALL_NEAR(vals(nn::InstanceNorm1d(3)(x32.slice(0, 0, 1).squeeze(0))), module_unbatched_y,
                   1e-6);
    CHECK(nn::InstanceNorm2d(8).named_buffers().empty());
    CHECK_ALL_NEAR(vals(nn::LocalResponseNorm(2)(x32)), lrn2_y, 1e-6);

    // errors
    Tensor x = Tensor::from_vector(xs, {2, 3, 4});
    CHECK_THROWS(F::rms_norm(x, {3}), "rms_norm", "[2,3,4]", "normalized_shape", "[3]");
    CHECK_THROWS(F::rms_norm(x, {4}, Tensor::ones({3})), "rms_norm", "weight", "[3]");
    CHECK_THROWS(F::instance_norm(x.slice(2, 0, 1)), "instance_norm", "[2,3,1]", "1 position");
    CHECK_THROWS(F::instance_norm(x.slice(0, 0, 1).squeeze(0)), "instance_norm", "[3,4]");
    CHECK_THROWS(F::instance_norm(x, Tensor::zeros({2}), running_var), "instance_norm",
                 "running_mean", "[2]", "3 channels");
    CHECK_THROWS(F::instance_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false),
                 "instance_norm", "running_mean");
    CHECK_THROWS(nn::InstanceNorm1d(4, 1e-5, 0.1, true)(x), "InstanceNorm1d", "[2,3,4]", "4");
    CHECK_THROWS(nn::InstanceNorm3d(3)(x), "InstanceNorm3d", "[2,3,4]");
    CHECK_THROWS(F::local_response_norm(x, 0), "local_response_norm", "size", "0");
    CHECK_THROWS(nn::LocalResponseNorm(-1), "LocalResponseNorm", "-1");
    CHECK_THROWS(F::glu(x.slice(2, 0, 3)), "glu", "[2,3,3]", "even");
    CHECK_THROWS(F::glu(x, 1), "glu", "axis 1");
}

TEST(loss_l1_smooth_l1_huber_nll_match_loop) {
    std::vector<float> p = randf(12, 50, -2, 2), t = randf(12, 51, -2, 2);
    Tensor P = fv(p, {3, 4}), T = fv(t, {3, 4});
    Vec l1, smooth, huber;
    for (size_t i = 0; i < p.size(); i++) {
        double d = std::fabs(double(p[i]) - double(t[i]));
        l1.push_back(d);
        smooth.push_back(d < 0.7 ? d * d / (2 * 0.7) : d - 0.35);
        huber.push_back(d <= 0.7 ? d * d / 2 : 0.7 * (d - 0.35));
    }
    auto mean = [](const Vec& v) { double s = 0; for (double e : v) s += e; return s / double(v.size()); };
    CHECK_ALL_NEAR(vals(nn::l1_loss(P, T, nn::Reduction::NONE)), l1, F32);
    CHECK_NEAR(nn::l1_loss(P, T).item(), mean(l1), F32);
    CHECK_ALL_NEAR(vals(nn::smooth_l1_loss(P, T, nn::Reduction::NONE, 0.7)), smooth, F32);
    CHECK_NEAR(nn::smooth_l1_loss(P, T, nn::Reduction::SUM, 0.7).item(), mean(smooth) * 12, F32);
    CHECK_NEAR(nn::smooth_l1_loss(P, T, nn::Reduction::MEAN, 0).item(), mean(l1), F32);
    CHECK_ALL_NEAR(vals(nn::huber_loss(P, T, nn::Reduction::NONE, 0.7)), huber, F32);
    CHECK_NEAR(nn::huber_loss(P, T, nn::Reduction::MEAN, 0.7).item(), mean(huber), F32);
    CHECK_THROWS(nn::l1_loss(P, fv(t)), "l1_loss", "[3,4]", "[12]");
    CHECK_THROWS(nn::smooth_l1_loss(P, T, nn::Reduction::MEAN, -1), "smooth_l1_loss", "beta", "-1");
    CHECK_THROWS(nn::huber_loss(P, T, nn::Reduction::MEAN, 0), "huber_loss", "delta", "0");

    // nll_loss of log_softmax is cross_entropy, ignored targets too
    Tensor logits = fv(randf(12, 52, -3, 3), {3, 4}), target = Tensor::from_vector({3, -100, 1});
    Tensor lp = logits.log_softmax(-1);
    Vec lpv = vals(lp);
    CHECK_NEAR(nn::nll_loss(lp, target).item(), -(lpv[3] + lpv[9]) / 2, F32);
    CHECK_NEAR(nn::nll_loss(lp, target).item(), nn::cross_entropy(logits, target).item(), F32);
    CHECK_ALL_NEAR(vals(nn::nll_loss(lp, target, nn::Reduction::NONE)), (Vec{-lpv[3], 0, -lpv[9]}), F32);
    CHECK_THROWS(nn::nll_loss(lp, fv({1, 2, 3})), "nll_loss", "int32 or int64", "float32");
    CHECK_THROWS(nn::nll_loss(lp, Tensor::from_vector({1, 2})), "nll_loss", "log_probs", "[3,4]", "[3]", "[2]");
    CHECK_THROWS(nn::cross_entropy(logits, Tensor::from_vector({1, 2})), "cross_entropy", "logits");
}

namespace {
// PyTorch's RMSprop and Adagrad, in double
Vec rmsprop_reference(const Quadratic& q, int steps, double lr, double alpha, double eps, double wd,
                      double momentum, bool centered) {
    Vec p = D(q.p0), v(p.size(), 0.0), mean(p.size(), 0.0), buf(p.size(), 0.0);
    for (int t = 1; t <= steps; t++) {
        Vec next = p;
        for (size_t i = 0; i < p.size(); i++) {
            double g = q.grad(p, i) + wd * p[i];
            v[i] = alpha * v[i] + (1 - alpha) * g * g;
            double avg = v[i];
            if (centered) {
                mean[i] = alpha * mean[i] + (1 - alpha) * g;
                avg -= mean[i] * mean[i];
            }
            double d = g / (std::sqrt(avg) + eps);
            if (momentum != 0) d = buf[i] = momentum * buf[i] + d;
            next[i] = p[i] - lr * d;
        }
        p = next;
    }
    return p;
}
Vec adagrad_reference(const Quadratic& q, int steps, double lr, double lr_decay, double wd,
                      double initial, double eps) {
    Vec p = D(q.p0), sum(p.size(), initial);
    for (int t = 1; t <= steps; t++) {
        Vec next = p;
        for (size_t i = 0; i < p.size(); i++) {
            double g = q.grad(p, i) + wd * p[i];
            sum[i] += g * g;
            next[i] = p[i] - lr / (1 + (t - 1) * lr_decay) * g / (std::sqrt(sum[i]) + eps);
        }
        p = next;
    }
    return p;
}
}  // namespace

TEST(optim_rmsprop_and_adagrad_three_steps_match_reference) {
    Quadratic q(6, 80);
    {
        Tensor p = quad_param(q);
        optim::RMSprop opt({p}, 0.01);
        for (int s = 1; s <= 3; s++) {
            quad_step(q, p, opt);
            CHECK_ALL_NEAR(vals(p), rmsprop_reference(q, s, 0.01, 0.99, 1e-8, 0, 0, false), 1e-5);
        }
    }
    {   // centered, with momentum and weight decay; its state by PyTorch's names
        Tensor p = quad_param(q);
        optim::RMSprop opt({p}, 0.02, 0.9, 1e-6, 0.1, 0.5, true);
        for (int s = 1; s <= 3; s++) quad_step(q, p, opt);
        CHECK_ALL_NEAR(vals(p), rmsprop_reference(q, 3, 0.02, 0.9, 1e-6, 0.1, 0.5, true), 1e-5);
        std::map<std::string, Tensor> state = opt.state_dict();
        CHECK(state.count("state.0.square_avg") && state.count("state.0.grad_avg") &&
              state.count("state.0.momentum_buffer"));
    }
    for (double lr_decay : {0.0, 0.3}) {
        Tensor p = quad_param(q);
        optim::Adagrad opt({p}, 0.1, lr_decay, 0.05, 0.2);
        for (int s = 1; s <= 3; s++) {
            quad_step(q, p, opt);
            CHECK_ALL_NEAR(vals(p), adagrad_reference(q, s, 0.1, lr_decay, 0.05, 0.2, 1e-10), 1e-5);
        }
        CHECK(opt.state_dict().count("state.0.sum"));
    }
}

// Eight steps on 0.5·Σ w(p - c)², each step's parameter against PyTorch 1.13's optimizers
// (NAdam: a float64 loop of PyTorch 2's, tests/data/make_reference.py); RAdam's rectified steps
// begin at the sixth (β2 = 0.9)
TEST(optim_adamax_nadam_radam_adadelta_rprop_asgd_match_pytorch) {
    Reference ref = read_reference("tests/data/optimizer_reference.txt");
    CHECK_EQ(ref.cases.size(), size_t(49));
    Tensor c = ref.inputs.at("c").cast(DType::FLOAT32), w = ref.inputs.at("w").cast(DType::FLOAT32);
    using Make = std::function<std::unique_ptr<optim::Optimizer>(const Tensor&)>;
    const std::vector<std::pair<std::string, Make>> optimizers = {
        {"adamax", [](const Tensor& p) {
             return std::make_unique<optim::Adamax>(std::vector<Tensor>{p}, 0.05, 0.8, 0.95, 1e-6,
                                                    0.1);
         }},
        {"nadam", [](const Tensor& p) {
             return std::make_unique<optim::NAdam>(std::vector<Tensor>{p}, 0.05, 0.85, 0.95, 1e-6,
                                                   0.1, 0.02);
         }},
        {"radam", [](const Tensor& p) {
             return std::make_unique<optim::RAdam>(std::vector<Tensor>{p}, 0.05, 0.8, 0.9, 1e-6,
                                                   0.1);
         }},
        {"adadelta", [](const Tensor& p) {
             return std::make_unique<optim::Adadelta>(std::vector<Tensor>{p}, 0.5, 0.8, 1e-4, 0.1);
         }},
        {"rprop", [](const Tensor& p) {
             return std::make_unique<optim::Rprop>(std::vector<Tensor>{p}, 0.3,
                                                   std::pair<double, double>{0.4, 1.5},
                                                   std::pair<double, double>{0.01, 0.5});
         }},
        {"asgd", [](const Tensor& p) {
             return std::make_unique<optim::ASGD>(std::vector<Tensor>{p}, 0.2, 0.05, 0.6, 3, 0.1);
         }},
    };
    for (const auto& [name, make] : optimizers) {
        Tensor p = ref.inputs.at("p0").cast(DType::FLOAT32).detach().requires_grad();
        std::unique_ptr<optim::Optimizer> opt = make(p);
        for (int step = 1; step <= 8; step++) {
            opt->zero_grad();
            Tensor d = p - c;
            (d * d * w * 0.5f).sum().backward();
            opt->step();
            const std::string key = name + "_" + std::to_string(step);
            CHECK(ref.cases.count(key) == 1);
            if (!ref.cases.count(key)) continue;
            const int before = th::failures();
            CHECK_ALL_NEAR(vals(p), ref.cases.at(key).values, 1e-5);
            if (th::failures() > before) std::fprintf(stderr, "  at %s\n", key.c_str());
        }
        std::map<std::string, Tensor> state = opt->state_dict();
        if (name == "adamax") CHECK(state.count("state.0.exp_avg") && state.count("state.0.exp_inf"));
        if (name == "nadam") CHECK(state.count("state.0.mu_product"));
        if (name == "adadelta") CHECK(state.count("state.0.acc_delta"));
        if (name == "rprop") CHECK(state.count("state.0.prev") && state.count("state.0.step_size"));
        if (name == "asgd") {
            auto& asgd = dynamic_cast<optim::ASGD&>(*opt);
            CHECK_ALL_NEAR(vals(asgd.ax[0]), ref.cases.at("asgd_ax").values, 1e-5);
        }
    }
    Tensor p = Tensor::zeros({2}).requires_grad();
    CHECK_THROWS(optim::NAdam({p}, 0.01, 1.0), "NAdam", "betas");
    CHECK_THROWS(optim::RAdam({p}, 0.01, 0.9, 0.999, -1), "RAdam", "eps");
    CHECK_THROWS(optim::Adamax({p}, -0.01), "lr");
    CHECK_THROWS(optim::Rprop({p}, 0.01, {0.5, 0.9}), "Rprop", "etas", "(0.5, 0.9)");
    CHECK_THROWS(optim::Rprop({p}, 0.01, {0.5, 1.2}, {1, 0.5}), "Rprop", "step_sizes");
    CHECK_THROWS(optim::ASGD({p}, 0.01, 1e-4, 0.75, 1e6, -1), "ASGD", "weight_decay");
    CHECK_THROWS(optim::Adadelta({p}, 1.0, 1.5), "Adadelta", "rho", "1.5");
    CHECK_THROWS(optim::NAdam({p}, 0.01, 0.9, 0.999, 1e-8, 0, -1), "NAdam", "momentum_decay");
}

TEST(loss_binary_cross_entropy_matches_loop) {
    std::vector<float> p = {0, 0.3f, 0.9f, 1, 0.5f, 1e-30f}, t = {0, 1, 0.5f, 0, 1, 1};
    Vec want;
    for (size_t i = 0; i < p.size(); i++)
        want.push_back(-(t[i] * std::max(std::log(double(p[i])), -100.0) +
                         (1 - t[i]) * std::max(std::log1p(-double(p[i])), -100.0)));
    CHECK_ALL_NEAR(vals(nn::binary_cross_entropy(fv(p), fv(t), nn::Reduction::NONE)), want, F32);
    double mean = 0;
    for (double w : want) mean += w / double(want.size());
    CHECK_NEAR(nn::binary_cross_entropy(fv(p), fv(t)).item(), mean, F32);
    CHECK_THROWS(nn::binary_cross_entropy(fv(p), fv({1, 0})), "binary_cross_entropy", "[6]", "[2]");
    // the gradient is PyTorch's (p - t)/max(p(1 - p), 1e-12): finite where p is 0 or 1, so a
    // saturated sigmoid passes 0, not NaN
    Tensor pg = fv(p).requires_grad();
    nn::binary_cross_entropy(pg, fv(t), nn::Reduction::SUM).backward();
    Vec grad;
    for (size_t i = 0; i < p.size(); i++)
        grad.push_back((double(p[i]) - t[i]) / std::max(double(p[i]) * (1 - double(p[i])), 1e-12));
    CHECK_ALL_NEAR(vals(pg.grad()), grad, F32);
    Tensor x = fv({20, -20, 3}).requires_grad();
    nn::binary_cross_entropy(x.sigmoid(), fv({1, 0, 1})).backward();
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{0, 1 / (1 + std::exp(20.0)) / 3, (1 / (1 + std::exp(-3.0)) - 1) / 3}),
                   F32);
}

// AveragedModel: SWA's equal mean and ema's moving average of the parameters after each step,
// against the same on the host; buffers copied, or averaged with use_buffers (integers
// copied); a jitted step averages as the eager one; errors
TEST(optim_averaged_model_averages_parameters) {
    tg::manual_seed(300);
    nn::Sequential net(nn::Linear(2, 3), nn::BatchNorm1d(3), nn::Linear(3, 1));
    nn::Sequential swa_net(nn::Linear(2, 3), nn::BatchNorm1d(3), nn::Linear(3, 1));
    nn::Sequential ema_net(nn::Linear(2, 3), nn::BatchNorm1d(3), nn::Linear(3, 1));
    optim::AveragedModel swa(net, swa_net), ema(net, ema_net, optim::ema(0.75), true);
    optim::SGD opt(net.parameters(), 0.1);
    std::map<std::string, Tensor> initial;
    for (auto& [name, t] : net.state_dict()) initial[name] = t.clone().realize();
    Tensor x = fv(randf(6 * 2, 301), {6, 2}), y = fv(randf(6, 302), {6, 1});
    auto step = [&]() {
        Tensor loss = nn::mse_loss(net(x), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        swa.update_parameters();
        ema.update_parameters();
        return loss;
    };
    std::vector<Tensor> averaged_now = net.parameters();
    averaged_now.push_back(static_cast<nn::BatchNorm1d&>(*net.children()[1].second).running_mean);
    std::vector<Vec> mean(averaged_now.size()), moving(averaged_now.size());
    for (int k = 0; k < 4; k++) {
        step().item();
        for (size_t i = 0; i < averaged_now.size(); i++) {
            Vec now = vals(averaged_now[i]);
            if (k == 0) mean[i] = moving[i] = now;
            for (size_t j = 0; j < now.size() && k > 0; j++) {
                mean[i][j] += (now[j] - mean[i][j]) / (k + 1);
                moving[i][j] += (now[j] - moving[i][j]) * 0.25;
            }
        }
    }
    CHECK_EQ(swa.n_averaged.item(), 4.0);
    std::vector<Tensor> swa_ps = swa_net.parameters(), ema_ps = ema_net.parameters();
    for (size_t i = 0; i < swa_ps.size(); i++) {
        CHECK_ALL_NEAR(vals(swa_ps[i]), mean[i], 1e-6);
        CHECK_ALL_NEAR(vals(ema_ps[i]), moving[i], 1e-6);
    }
    auto buffers = [](nn::Module& m) {
        std::map<std::string, Vec> out;
        for (auto& [name, t] : m.named_buffers()) out[name] = vals(t);
        return out;
    };
    std::map<std::string, Vec> now = buffers(net), copied = buffers(swa_net),
                               averaged = buffers(ema_net);
    CHECK(copied == now);
    CHECK_ALL_NEAR(averaged.at("1.running_mean"), moving.back(), 1e-6);
    CHECK(averaged.at("1.num_batches_tracked") == (Vec{4}));
    CHECK(averaged.at("1.running_var") != now.at("1.running_var"));
    // the same four steps jitted: the same averages
    nn::Sequential net2(nn::Linear(2, 3), nn::BatchNorm1d(3), nn::Linear(3, 1));
    nn::Sequential ema_net2(nn::Linear(2, 3), nn::BatchNorm1d(3), nn::Linear(3, 1));
    net2.load_state_dict(initial);
    optim::AveragedModel ema2(net2, ema_net2, optim::ema(0.75), true);
    optim::SGD opt2(net2.parameters(), 0.1);
    tg::Jit jitted([&](const std::vector<Tensor>& in) {
        Tensor loss = nn::mse_loss(net2(in[0]), in[1]);
        opt2.zero_grad();
        loss.backward();
        opt2.step();
        ema2.update_parameters();
        return loss;
    });
    for (int k = 0; k < 4; k++) jitted({x, y}).item();
    CHECK_EQ(jitted.replays(), int64_t(3));
    CHECK_EQ(ema2.n_averaged.item(), 4.0);
    std::vector<Tensor> ema2_ps = ema_net2.parameters();
    for (size_t i = 0; i < ema2_ps.size(); i++) {
        CHECK_ALL_NEAR(vals(net2.parameters()[i]), vals(net.parameters()[i]), 1e-6);
        CHECK_ALL_NEAR(vals(ema2_ps[i]), vals(ema_ps[i]), 1e-6);
    }
    // errors
    nn::Linear narrow(2, 3), wide(3, 2);
    CHECK_THROWS(optim::AveragedModel(narrow, wide),
                 "AveragedModel: the models differ at parameters 0: weight float32 [3,2] and "
                 "weight float32 [2,3]");
    CHECK_THROWS(optim::AveragedModel(narrow, net), "AveragedModel: the models differ: 2 "
                 "parameters and 6");
    CHECK_THROWS(optim::ema(1.5), "optim::ema: decay must be in [0, 1], got 1.5");
}

// WeightNorm and SpectralNorm on Linear, Conv1d and ConvTranspose1d against PyTorch's
// parametrizations (given g, and given starting vectors u, v); PyTorch's state_dict names; a
// WeightNorm starts as its layer; errors
TEST(nn_weight_norm_and_spectral_norm_match_pytorch) {
    Reference ref = read_reference("tests/data/parametrization_reference.txt");
    CHECK_EQ(ref.cases.size(), size_t(9));
    using X = const std::vector<Tensor>&;
    namespace pz = nn::parametrization;
    auto copy = [&](const char* name, int64_t n) { // a buffer of its own, unit length
        Tensor t = ref.inputs.at(name).slice(0, 0, n);
        return (t / t.square().sum().sqrt()).realize();
    };
    auto spectral_linear = [=](const Tensor& w, bool training) {
        nn::SpectralNorm<nn::Linear> m(nn::Linear(3, 4, false));
        m.original = w;
        m.uv = {copy("u0", 4), copy("v0", 3)};
        m.train(training);
        return m;
    };
    auto transposed = [=](const Tensor& w) {
        nn::SpectralNorm<nn::ConvTranspose1d> m(nn::ConvTranspose1d(4, 2, 3, 1, 0, 0, 1, false));
        m.original = w;
        m.uv = {copy("u2", 2), copy("v12", 12)};
        return m;
    };
    auto transposed_input = [](const Tensor& x) { return x.reshape({1, 4, 1}).expand({1, 4, 3}); };
    Cases cases = {
        {"weight_norm_linear",
         {{"v", "g", "b", "x"},
          [](X x) {
              nn::WeightNorm<nn::Linear> m(nn::Linear(3, 2));
              m.v = x[0], m.g = x[1], m.layer.bias = x[2];
              return m(x[3]);
          }}},
        {"weight_norm_conv1d_all",
         {{"cv", "cb", "cx"},
          [](X x) {
              nn::WeightNorm<nn::Conv1d> m(nn::Conv1d(2, 4, 3), std::nullopt);
              m.v = x[0], m.g = (pz::norm_except(x[0], std::nullopt) * 0.5).detach();
              m.layer.bias = x[1];
              return m(x[2]);
          }}},
        {"weight_norm_conv1d_dim_1",
         {{"cv", "cx"},
          [](X x) {
              nn::WeightNorm<nn::Conv1d> m(nn::Conv1d(2, 4, 3, 1, 0, 1, 1, false), 1);
              m.v = x[0], m.g = pz::norm_except(x[0], 1).detach();
              return m(x[1]);
          }}},
        {"spectral_norm_linear",
         {{"w4", "x"}, [=](X x) { return spectral_linear(x[0], true)(x[1]); }}},
        {"spectral_norm_linear_vectors",
         {{},
          [=](X) {
              auto m = spectral_linear(ref.inputs.at("w4"), true);
              m(ref.inputs.at("x"));
              return tg::cat({m.uv.u, m.uv.v});
          }}},
        {"spectral_norm_linear_eval",
         {{"w4", "x"}, [=](X x) { return spectral_linear(x[0], false)(x[1]); }}},
        {"spectral_norm_conv1d",
         {{"cv", "cx"},
          [=](X x) {
              nn::SpectralNorm<nn::Conv1d> m(nn::Conv1d(2, 4, 3, 1, 0, 1, 1, false));
              m.original = x[0];
              m.uv = {copy("u0", 4), copy("v0", 6)};
              return m(x[1]);
          }}},
        {"spectral_norm_conv_transpose1d",
         {{"cv", "cb"}, [=](X x) { return transposed(x[0])(transposed_input(x[1])); }}},
        {"spectral_norm_conv_transpose1d_vectors",
         {{},
          [=](X) {
              auto m = transposed(ref.inputs.at("cv"));
              m(transposed_input(ref.inputs.at("cb")));
              return tg::cat({m.uv.u, m.uv.v});
          }}},
    };
    check_cases(ref, cases, 1e-12);
    // names as PyTorch's state_dict; a WeightNorm starts as its layer; a SpectralNorm's weight
    // from its own start has σ near 1 (15 iterations)
    tg::manual_seed(400);
    nn::Linear plain(3, 5);
    nn::WeightNorm<nn::Linear> normed(plain);
    nn::SpectralNorm<nn::Conv1d> spectral(nn::Conv1d(2, 4, 3));
    std::vector<std::string> names;
    for (auto& [name, t] : normed.state_dict())
        names.push_back(name);
    CHECK((names == std::vector<std::string>{"bias", "parametrizations.weight.original0",
                                             "parametrizations.weight.original1"}));
    names.clear();
    for (auto& [name, t] : spectral.state_dict())
        names.push_back(name);
    CHECK((names == std::vector<std::string>{"bias", "parametrizations.weight.0._u",
                                             "parametrizations.weight.0._v",
                                             "parametrizations.weight.original"}));
    CHECK_EQ(normed.g.shape(), (Shape{5, 1}));
    Tensor x = fv(randf(4 * 3, 401), {4, 3}), cx = fv(randf(2 * 2 * 6, 402), {2, 2, 6});
    spectral.eval();
    Tensor sn_weight = pz::spectral_normalized(spectral.original, spectral.uv, 0, 1, 1e-12, false);
    Tensor normed_y = normed(x), plain_y = plain(x);
    Tensor sigma = tg::linalg::matrix_norm(sn_weight.flatten(1), 2.0);
    tg::realize({normed_y, plain_y, sigma});
    CHECK_ALL_NEAR(vals(normed_y), vals(plain_y), 1e-6);
    CHECK_NEAR(sigma.item(), 1.0, 1e-3);
    // in a Sequential, seeds handed out in layer order, u's with its layer's: one seed, one
    // model; another seed, another u
    auto model_state = [](uint64_t seed) {
        tg::manual_seed(seed);
        nn::Sequential m(nn::SpectralNorm<nn::Linear>(nn::Linear(3, 4)),
                         nn::WeightNorm<nn::Linear>(nn::Linear(4, 2)));
        std::map<std::string, Vec> out;
        for (auto& [name, t] : m.state_dict())
            out[name] = vals(t);
        return out;
    };
    std::map<std::string, Vec> first = model_state(7), again = model_state(7),
                               other = model_state(8);
    CHECK_EQ(first.size(), size_t(7));
    CHECK(first == again);
    CHECK(first.at("0.parametrizations.weight.0._u") != other.at("0.parametrizations.weight.0._u"));
    // errors
    CHECK_THROWS(nn::WeightNorm<nn::Linear>(nn::Linear(3, 2), 2),
                 "WeightNorm: axis 2 out of range for shape [2,3]");
    CHECK_THROWS(nn::SpectralNorm<nn::Linear>(nn::Linear(3, 2), 1, 1e-12, -3),
                 "SpectralNorm: axis -3 out of range for shape [2,3]");
}

// LBFGS against PyTorch's on Rosenbrock's function of two parameters (the parameters, loss,
// evaluations and iterations after each step), without and with the strong Wolfe line
// search; float32 parameters get there too; errors
TEST(optim_lbfgs_matches_pytorch) {
    Reference ref = read_reference("tests/data/lbfgs_reference.txt");
    CHECK_EQ(ref.cases.size(), size_t(3));
    auto run = [](DType dtype, const std::string& line_search, int steps = 3, double lr = 1,
                  int history_size = 100, int max_iter = 20) {
        Tensor a = Tensor::from_vector(Vec{-1.5, 2.0}).cast(dtype).realize().requires_grad();
        Tensor b = Tensor::from_vector(Vec{0.5}).cast(dtype).realize().requires_grad();
        optim::LBFGS opt({a, b}, lr, max_iter, std::nullopt, 1e-7, 1e-9, history_size, line_search);
        auto closure = [&] {
            opt.zero_grad();
            Tensor x = tg::cat({a, b});
            Tensor head = x.slice(0, 0, 2), tail = x.slice(0, 1, 3);
            Tensor loss = ((tail - head * head).square() * 100 + (1 - head).square()).sum();
            loss.backward();
            return loss;
        };
        Vec rows;
        for (int k = 0; k < steps; k++) {
            double loss = opt.step(closure).item();
            for (double v : vals(a))
                rows.push_back(v);
            rows.insert(rows.end(), {vals(b)[0], loss, double(opt.func_evals), double(opt.n_iter)});
        }
        return Tensor::from_vector(rows, {steps, 6});
    };
    using X = const std::vector<Tensor>&;
    Cases cases = {
        {"lbfgs", {{}, [&](X) { return run(DType::FLOAT64, ""); }}},
        {"lbfgs_strong_wolfe", {{}, [&](X) { return run(DType::FLOAT64, "strong_wolfe"); }}},
        {"lbfgs_strong_wolfe_short",
         {{}, [&](X) { return run(DType::FLOAT64, "strong_wolfe", 2, 0.5, 3, 10); }}},
    };
    // (without the line search, rounding apart grows with the iterations: 2e-11 after the
    // second step's 40, 2e-7 after the third's 60)
    check_cases(ref, cases, 1e-6);
    // float32: near the minimum (1, 1, 1) after three steps with the line search
    Vec found = vals(run(DType::FLOAT32, "strong_wolfe"));
    CHECK_ALL_NEAR((Vec{found[12], found[13], found[14]}), (Vec{1, 1, 1}), 1e-4);
    // errors
    Tensor p = fv({1, 2}).requires_grad();
    CHECK_THROWS(optim::LBFGS({p}, 1, 20, std::nullopt, 1e-7, 1e-9, 100, "wolfe"),
                 "LBFGS: line_search_fn must be \"\" or \"strong_wolfe\", got \"wolfe\"");
    CHECK_THROWS(optim::LBFGS({p}, -1), "LBFGS: lr must be at least 0, got -1");
    CHECK_THROWS(optim::LBFGS({p}, 1, 0), "LBFGS: max_iter 0, max_eval 0 and history_size 100");
}
