// Values that a PyTorch script wrote for the tests to check (tests/data/make_reference.py),
// read from its text file: lines
//   input NAME [SHAPE] {VALUES}
//   case NAME [SHAPE OF THE RESULT] {VALUES} {GRADIENT} ...   (one gradient per input)
// An input is a float64 tensor; a case holds its result and its inputs' gradients, those of
// Σ y·c with c_i = i/10 - 1 over the result's elements in order (check_case).
#pragma once
#include "harness.hpp"
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

struct Reference {
    struct Case {
        tg::Shape shape;
        std::vector<double> values;
        std::vector<std::vector<double>> gradients;
    };
    std::map<std::string, tg::Tensor> inputs;
    std::map<std::string, Case> cases;
};

inline Reference read_reference(const std::string& path) {
    Reference ref;
    std::ifstream file(path);
    // the numbers of the next open ... close group on the line, or nothing if there is none
    auto group = [](std::istream& in, char open, char close, std::vector<double>& v) {
        std::string text;
        if (!std::getline(in, text, close) || text.find(open) == std::string::npos) return false;
        std::replace(text.begin(), text.end(), ',', ' ');
        std::istringstream items(text.substr(text.find(open) + 1));
        v.clear();
        for (std::string item; items >> item;) v.push_back(std::strtod(item.c_str(), nullptr));
        return true;
    };
    for (std::string line; std::getline(file, line);) {
        std::istringstream in(line);
        std::string kind, name;
        in >> kind >> name;
        std::vector<double> sizes, values;
        if (!group(in, '[', ']', sizes) || !group(in, '{', '}', values)) continue;
        tg::Shape shape(sizes.begin(), sizes.end());
        if (kind == "input") {
            ref.inputs[name] = tg::Tensor::from_vector(values, shape);
            continue;
        }
        Reference::Case& c = ref.cases[name];
        c.shape = shape;
        c.values = values;
        for (std::vector<double> g; group(in, '{', '}', g);) c.gradients.push_back(g);
    }
    return ref;
}

// y, computed from inputs, and the inputs' gradients of Σ y·c against the case, to within tol
// (relative and absolute), all computed by one program (no inputs: y's values alone); a
// failure names the case
inline void check_case(const std::string& name, const Reference::Case& c, const tg::Tensor& y,
                       const std::vector<tg::Tensor>& inputs, double tol) {
    const int before = th::failures();
    CHECK(y.shape() == c.shape);
    CHECK_EQ(c.gradients.size(), inputs.size());
    if (y.shape() == c.shape && inputs.empty()) {   // values alone (integers among them)
        CHECK_ALL_NEAR(y.to_vector<double>(), c.values, tol);
    } else if (y.shape() == c.shape && c.gradients.size() == inputs.size()) {
        std::vector<double> weights;
        for (size_t i = 0; i < c.values.size(); i++) weights.push_back(double(i) / 10 - 1);
        tg::Tensor weighted = (y * tg::Tensor::from_vector(weights, c.shape).cast(y.dtype())).sum();
        std::vector<tg::Tensor> grads = tg::gradients(weighted, inputs), all = grads;
        all.push_back(y);
        tg::realize(all);
        CHECK_ALL_NEAR(y.to_vector<double>(), c.values, tol);
        for (size_t i = 0; i < grads.size(); i++)
            CHECK_ALL_NEAR(grads[i].to_vector<double>(), c.gradients[i], tol);
    }
    if (th::failures() > before) std::fprintf(stderr, "  in case %s\n", name.c_str());
}

// The cases of a reference file and how this project computes each: the names of its inputs
// (taken from the file, each to be differentiated) and the function of them
using CaseInputs = const std::vector<tg::Tensor>&;
using Cases =
    std::map<std::string, std::pair<std::vector<const char*>, std::function<tg::Tensor(CaseInputs)>>>;
// every case of ref against ours, as check_case, all computed by one program (one compile
// instead of one a case); a case ours lacks fails
inline void check_cases(const Reference& ref, const Cases& ours, double tol) {
    struct Computed {
        const std::string* name;
        const Reference::Case* want;
        tg::Tensor y;
        std::vector<tg::Tensor> grads;
    };
    std::vector<Computed> computed;
    std::vector<tg::Tensor> all;
    for (const auto& [name, c] : ref.cases) {
        auto found = ours.find(name);
        CHECK(found != ours.end());
        if (found == ours.end()) continue;
        std::vector<tg::Tensor> x;
        for (const char* input : found->second.first)
            x.push_back(ref.inputs.at(input).detach().requires_grad());
        tg::Tensor y = found->second.second(x);
        CHECK(y.shape() == c.shape);
        CHECK_EQ(c.gradients.size(), x.size());
        if (y.shape() != c.shape || c.gradients.size() != x.size()) continue;
        std::vector<tg::Tensor> grads;
        if (!x.empty()) {
            std::vector<double> weights;
            for (size_t i = 0; i < c.values.size(); i++) weights.push_back(double(i) / 10 - 1);
            tg::Tensor c_y = tg::Tensor::from_vector(weights, c.shape).cast(y.dtype());
            grads = tg::gradients((y * c_y).sum(), x);
        }
        all.push_back(y);
        all.insert(all.end(), grads.begin(), grads.end());
        computed.push_back({&name, &c, y, grads});
    }
    tg::realize(all);
    for (const Computed& k : computed) {
        const int before = th::failures();
        CHECK_ALL_NEAR(k.y.to_vector<double>(), k.want->values, tol);
        for (size_t i = 0; i < k.grads.size(); i++)
            CHECK_ALL_NEAR(k.grads[i].to_vector<double>(), k.want->gradients[i], tol);
        if (th::failures() > before) std::fprintf(stderr, "  in case %s\n", k.name->c_str());
    }
}
