// Values that a PyTorch script wrote for the tests to check (tests/data/make_reference.py),
// read from its text file: lines
//   input NAME [SHAPE] {VALUES}
//   case NAME [SHAPE OF THE RESULT] {VALUES} {GRADIENT} ...   (one gradient per input)
// An input is a float64 tensor; a case holds its result and its inputs' gradients.
#pragma once
#include "../tinygrad.hpp"
#include <algorithm>
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
        for (double d; items >> d;) v.push_back(d);
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
