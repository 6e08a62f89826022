// 06_gpt.cpp — a character-level GPT that learns to write names, with checkpoints that resume.
//
// The names of data/names.txt become one stream of characters, each name followed by '.'.
// The model reads windows of 16 characters and predicts each next one: token and position
// embeddings (64 numbers), two pre-LayerNorm transformer blocks (causal self-attention with 4
// heads, an MLP with GELU), a last LayerNorm and a linear head over the 27 characters. AdamW
// trains it on random windows with a linear warm-up and a cosine decay of the learning rate,
// gradients clipped to norm 1; the whole step is one compiled program (tg::jit). A tenth of the
// distinct names is held out and its loss reported beside the training loss. Every --every
// steps it saves a checkpoint (weights, optimizer state, step, random state); --resume goes on
// from one, bit for bit as if it had never stopped. At the end it samples names with a
// temperature and top-k.
//
// Build alone:  c++ -std=c++17 -O2 examples/06_gpt.cpp -o 06_gpt -ldl -lpthread
// Run:          ./06_gpt [options] [words.txt]
//   words.txt          one word per line; default data/names.txt beside the executable
//   --steps N          training steps (default 2000; --short: 60, for the tests)
//   --ckpt PATH        the checkpoint (default 06_gpt.safetensors in the current directory)
//   --every N          save a checkpoint every N steps (default 500) and at the end
//   --stop-after N     stop after step N (a checkpoint is saved), as if interrupted
//   --resume           go on from the checkpoint
//   --temperature T    sampling temperature (default 0.8); --top-k K (default 8)
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <unistd.h>

using tg::Tensor;
namespace nn = tg::nn;
namespace optim = tg::optim;
static const int64_t V = 27, CTX = 16, D = 64, HEADS = 4, LAYERS = 2, B = 32;

// tok, pos, blocks.N (ln1, attn.qkv, attn.proj, ln2, mlp.0, mlp.2), lnf, head: the names a
// PyTorch module with these attributes gives its parameters
struct GPT : nn::Module {
    nn::Embedding tok{V, D}, pos{CTX, D};
    nn::ModuleList blocks;
    nn::LayerNorm lnf{D};
    nn::Linear head{D, V, false};
    GPT() {
        for (int64_t l = 0; l < LAYERS; l++) blocks.append(nn::TransformerBlock(D, HEADS));
    }
    std::vector<std::pair<std::string, nn::Module*>> children() override {
        return {{"tok", &tok}, {"pos", &pos}, {"blocks", &blocks}, {"lnf", &lnf}, {"head", &head}};
    }
    Tensor forward(const Tensor& idx) override {   // [batch, time] → logits [batch, time, V]
        Tensor x = tok(idx) + pos(Tensor::arange(idx.size(1)));
        for (size_t i = 0; i < blocks.size(); i++) x = blocks.at<nn::TransformerBlock>(i)(x);
        return head(lnf(x));
    }
    Tensor loss(const Tensor& windows) {           // [batch, CTX + 1]: each next character
        Tensor logits = forward(windows.slice(1, 0, CTX));
        Tensor next = windows.slice(1, 1, CTX + 1).reshape({-1});
        return nn::cross_entropy(logits.reshape({-1, V}), next);
    }
};

static int usage(const char* why) {
    std::fprintf(stderr, "06_gpt: %s\nusage: 06_gpt [--short] [--steps N] [--ckpt PATH] "
                         "[--every N] [--stop-after N] [--resume] [--temperature T] [--top-k K] "
                         "[words.txt]\n", why);
    return 2;
}
static std::string exe_dir() {
    char buf[4096];
    ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
    std::string exe = len > 0 ? std::string(buf, size_t(len)) : ".";
    return exe.substr(0, exe.rfind('/'));
}
static std::string absolute(const std::string& path) {
    char cwd[PATH_MAX];
    return path[0] == '/' || !getcwd(cwd, sizeof cwd) ? path : std::string(cwd) + "/" + path;
}
static int32_t code(char c) { return c == '.' ? 0 : c - 'a' + 1; }

// The windows of a batch: B random starts in the stream, from a generator seeded by the step
// alone, so a resumed run draws the batches the uninterrupted one did.
static Tensor batch(const std::vector<int32_t>& stream, int64_t step) {
    std::mt19937 rng(uint32_t(step * 2654435761u + 12345));
    std::vector<int32_t> rows;
    for (int64_t b = 0; b < B; b++) {
        size_t at = rng() % (stream.size() - size_t(CTX));
        rows.insert(rows.end(), stream.begin() + long(at), stream.begin() + long(at) + CTX + 1);
    }
    return Tensor::from_vector(rows, {B, CTX + 1});
}

int main(int argc, char** argv) {
    int64_t steps = 2000, every = 500, stop_after = -1, top_k = 8;
    double temperature = 0.8;
    bool resume = false;
    std::string words_path, ckpt = "06_gpt.safetensors";
    auto count = [&](int& i, int64_t& out) {
        char* end = nullptr;
        long long n = i + 1 < argc ? std::strtoll(argv[++i], &end, 10) : 0;
        out = n;
        return end && !*end && n >= 1;
    };
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "--short") steps = 60, every = 30;
        else if (arg == "--steps") { if (!count(i, steps)) return usage("--steps needs a count"); }
        else if (arg == "--every") { if (!count(i, every)) return usage("--every needs a count"); }
        else if (arg == "--stop-after") {
            if (!count(i, stop_after)) return usage("--stop-after needs a step");
        } else if (arg == "--top-k") {
            if (!count(i, top_k) || top_k > V) return usage("--top-k needs a count up to 27");
        } else if (arg == "--temperature") {
            temperature = i + 1 < argc ? std::atof(argv[++i]) : 0;
            if (!(temperature > 0)) return usage("--temperature needs a positive number");
        } else if (arg == "--ckpt") {
            if (i + 1 >= argc) return usage("--ckpt needs a path");
            ckpt = argv[++i];
        } else if (arg == "--resume") resume = true;
        else if (arg[0] == '-') return usage(("unknown option " + arg).c_str());
        else words_path = arg;
    }
    if (words_path.empty()) words_path = exe_dir() + "/data/names.txt";
    std::ifstream file(words_path);
    if (!file) {
        std::fprintf(stderr, "06_gpt: cannot read the word list %s (give one as an argument)\n",
                     words_path.c_str());
        return 2;
    }

    // distinct names, shuffled with a fixed seed; a tenth held out
    std::set<std::string> distinct;
    for (std::string w; file >> w;)
        if (std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
            distinct.insert(w);
    std::vector<std::string> names(distinct.begin(), distinct.end());
    std::mt19937 shuffle_rng(42);
    for (size_t i = names.size(); i > 1; i--) std::swap(names[i - 1], names[shuffle_rng() % i]);
    size_t held = names.size() / 10;
    if (held < 1 || names.size() < 20) return usage("the word list needs at least 20 names");
    std::set<std::string> training(names.begin() + long(held), names.end());
    auto to_stream = [](auto first, auto last) {
        std::vector<int32_t> s{0};
        for (auto it = first; it != last; ++it) {
            for (char c : *it) s.push_back(code(c));
            s.push_back(0);
        }
        return s;
    };
    std::vector<int32_t> train_stream = to_stream(names.begin() + long(held), names.end());
    std::vector<int32_t> val_stream = to_stream(names.begin(), names.begin() + long(held));
    if (val_stream.size() <= size_t(CTX) + 1) return usage("too few held-out names");

    tg::manual_seed(1337);
    GPT model;
    std::vector<Tensor> params = model.parameters();
    optim::AdamW opt(params, 3e-3, 0.9, 0.99, 1e-8, 0.01);
    opt.schedule = optim::warmup_cosine(3e-3, std::min<int64_t>(100, steps / 10), steps, 3e-4);
    tg::Jit train_step([&](const std::vector<Tensor>& in) {
        Tensor loss = model.loss(in[0]);
        opt.zero_grad();
        loss.backward();
        nn::clip_grad_norm_(params, 1.0);
        opt.step();
        return loss;
    });
    int64_t step = 0;
    if (resume) {
        std::map<std::string, Tensor> saved, weights, state;
        try {
            saved = tg::safetensors::load(ckpt);
        } catch (const tg::Error& e) {
            std::fprintf(stderr, "06_gpt: cannot resume: %s\n", e.what());
            return 2;
        }
        for (auto& [name, t] : saved) {
            if (name.rfind("model.", 0) == 0) weights[name.substr(6)] = t;
            if (name.rfind("optim.", 0) == 0) state[name.substr(6)] = t;
        }
        if (!saved.count("step") || !saved.count("rng")) return usage("not a checkpoint of 06_gpt");
        model.load_state_dict(weights);
        opt.load_state_dict(state);
        step = int64_t(saved.at("step").item());
        tg::manual_seed(uint64_t(saved.at("rng").to_vector<int64_t>()[0]));
        std::printf("resumed from %s at step %lld\n", absolute(ckpt).c_str(), (long long)step);
    }
    auto save = [&]() {
        std::map<std::string, Tensor> out;
        for (auto& [name, t] : model.state_dict()) out["model." + name] = t;
        for (auto& [name, t] : opt.state_dict()) out["optim." + name] = t;
        out["step"] = Tensor::from_vector(std::vector<int64_t>{step}, {});
        out["rng"] = Tensor::from_vector(std::vector<int64_t>{int64_t(tg::rng_state())}, {});
        tg::safetensors::save(ckpt, out);
        std::printf("checkpoint %s (step %lld)\n", absolute(ckpt).c_str(), (long long)step);
    };
    // the held-out loss on 8 fixed batches, without dropout or gradients
    auto val_loss = [&]() {
        tg::NoGrad no_grad;
        model.eval();
        double total = 0;
        for (int64_t k = 0; k < 8; k++) total += model.loss(batch(val_stream, -1 - k)).item();
        model.train();
        return total / 8;
    };

    int64_t numbers = 0;
    for (const Tensor& p : params) numbers += p.numel();
    std::printf("06_gpt: %zu training names, %zu held out; %lld parameters in %zu tensors\n",
                training.size(), held, (long long)numbers, params.size());
    int64_t last = stop_after > 0 ? std::min(stop_after, steps) : steps;
    int64_t report = std::max<int64_t>(1, steps / 10);
    auto start = std::chrono::steady_clock::now();
    int64_t first_step = step;
    while (step < last) {
        Tensor loss = train_step({batch(train_stream, step)});
        step++;
        if (step % report == 0 || step == last) {
            double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                              .count();
            double rate = double(step - first_step) / std::max(secs, 1e-9);
            std::printf("step %5lld/%lld  loss %.4f  val %.4f  |  %.0f steps/s  |  %.0f s left\n",
                        (long long)step, (long long)steps, loss.item(), val_loss(), rate,
                        double(steps - step) / rate);
            std::fflush(stdout);
        }
        if (step % every == 0 || step == last) save();
    }
    if (step < steps) {
        std::printf("stopped after step %lld; go on with --resume\n", (long long)step);
        return 0;
    }

    // sampling: from a window of '.', the next character among the top_k most likely, with
    // probabilities softmax(logits / temperature), until '.'
    tg::NoGrad no_grad;
    model.eval();
    std::mt19937 rng(7);
    int fresh = 0;
    for (int n = 0; n < 20; n++) {
        std::vector<int32_t> window(CTX, 0);
        std::string name;
        while (name.size() < 24) {
            Tensor logits = model(Tensor::from_vector(window, {1, CTX}))[0][CTX - 1];
            tg::ValuesIndices top = (logits / temperature).topk(top_k);
            std::vector<float> p = top.values.softmax(-1).to_vector();
            std::vector<int64_t> ids = top.indices.to_vector<int64_t>();
            double u = rng() / 4294967296.0, sum = 0;
            size_t pick = p.size() - 1;
            for (size_t i = 0; i < p.size(); i++)
                if ((sum += p[i]) > u) { pick = i; break; }
            if (ids[pick] == 0) break;
            name += char('a' + ids[pick] - 1);
            window.erase(window.begin());
            window.push_back(int32_t(ids[pick]));
        }
        bool is_new = !training.count(name);
        fresh += is_new;
        std::printf("  %s%s\n", name.c_str(), is_new ? "" : "  (a training name)");
    }
    std::printf("%d of 20 samples are new names\n", fresh);
}
