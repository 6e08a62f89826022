// Several devices of one kind (CPU:1, CPU:2, ...), their queues and events, copies between
// them, and DataParallel: its split rule, its agreement with one device, the same bits on every
// run and thread count, one compile for every device, and steps that fail on one device
// without changing a parameter.
#include "harness.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

using tg::Tensor;
namespace nn = tg::nn;
namespace optim = tg::optim;

namespace {
using th::EnvGuard;

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

// every parameter's values, one after another
std::vector<float> flat(const std::vector<Tensor>& params) {
    std::vector<float> out;
    for (const Tensor& p : params)
        for (float v : values(p)) out.push_back(v);
    return out;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A small classification task: rows of `features` numbers, labels 0..classes-1.
struct Task {
    Tensor X, Y;
    Task(int64_t rows, int64_t features, int classes, uint64_t seed) {
        X = Tensor::from_vector(th::randf(size_t(rows * features), seed), {rows, features});
        Y = Tensor::from_vector(th::randi(size_t(rows), seed + 1, 0, classes - 1), {rows});
    }
};

// One device's step as a user writes it: the loss of the inputs, backward, the optimizer.
tg::Jit one_device_step(optim::Optimizer& opt,
                        std::function<Tensor(const std::vector<Tensor>&)> loss_of) {
    return tg::Jit([&opt, loss_of](const std::vector<Tensor>& in) {
        Tensor loss = loss_of(in);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
}

// `steps` steps of an MLP with SGD (momentum) on consecutive batches of `batch` rows, on one
// device with tg::Jit (devices empty) or with DataParallel; the parameters afterwards, and the
// losses in *losses.
std::vector<float> train_mlp(const std::vector<std::string>& devices, int steps, int64_t batch,
                             std::vector<float>* losses = nullptr) {
    Task task(96, 12, 5, 3);
    tg::manual_seed(11);
    nn::Sequential mlp(nn::Linear(12, 24), nn::Tanh(), nn::Linear(24, 24), nn::ReLU(),
                       nn::Linear(24, 5));
    optim::SGD opt(mlp.parameters(), 0.2, 0.9, 1e-3);
    auto loss_of = [&](const std::vector<Tensor>& in) {
        return nn::cross_entropy(mlp(in[0]), in[1]);
    };
    tg::Jit one = one_device_step(opt, loss_of);
    tg::DataParallel dp(devices.empty() ? std::vector<std::string>{"CPU"} : devices, opt, loss_of);
    for (int s = 0; s < steps; s++) {
        int64_t a = (s * batch) % (96 - batch + 1);
        std::vector<Tensor> in = {task.X.slice(0, a, a + batch), task.Y.slice(0, a, a + batch)};
        Tensor loss = devices.empty() ? one(in) : dp(in);
        if (losses) losses->push_back(float(loss.item()));
    }
    return flat(mlp.parameters());
}
}  // namespace

// ---- devices of one kind ---------------------------------------------------------------------

TEST(cpu_devices_are_made_when_named) {
    EnvGuard cpu("TG_DEVICE", "CPU");   // also under make test-cuda
    tg::detail::Device& one = tg::detail::device("CPU:1");
    CHECK_EQ(std::string(one.name()), std::string("CPU:1"));
    CHECK(&one != &tg::detail::device("CPU"));
    CHECK(&tg::detail::device("cpu:1") == &one);
    CHECK(&tg::detail::device("CPU:0") == &tg::detail::device("CPU"));
    CHECK(&tg::detail::device("CPU:2") != &one);
    CHECK_THROWS(tg::detail::device("CPU:x"), "unknown device 'CPU:x'", "CPU:1, CPU:2, ...");
    CHECK_THROWS(tg::detail::device("TPU:1"), "unknown device 'TPU:1'");

    Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3});
    Tensor b = a.to("CPU:1");
    Tensor a_before = a.clone().realize();
    CHECK_EQ(b.device(), std::string("CPU:1"));
    CHECK_ALL_NEAR(values((b * 2).exp().to("CPU")), values((a * 2).exp()), 0);
    a.assign(a * 10).realize();   // b has memory of its own
    CHECK_ALL_NEAR(values(b), (std::vector<float>{1, 2, 3}), 0);
    CHECK_EQ((b + 1).to("CPU:2").device(), std::string("CPU:2"));
    CHECK_THROWS(a_before + b, "ADD", "different devices", "float32 [3] on CPU",
                 "float32 [3] on CPU:1", "test_parallel.cpp");
}

TEST(device_queues_run_in_order_with_events_and_errors) {
    tg::detail::WorkQueue& q1 = tg::detail::device("CPU:1").queue();
    tg::detail::WorkQueue& q2 = tg::detail::device("CPU:2").queue();
    std::vector<int> order;
    std::thread::id ran_on;
    for (int i = 0; i < 5; i++)
        q1.enqueue([&, i] {
            order.push_back(i);
            ran_on = std::this_thread::get_id();
        });
    q1.synchronize();
    CHECK_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
    CHECK(ran_on != std::this_thread::get_id());   // the queue's own thread

    // q1 waits for an event of q2: it sees what q2 did before it, while q2's thread ran apart
    std::atomic<bool> written{false};
    q2.enqueue([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        written = true;
    });
    uint64_t event = q2.record();
    bool seen = false;
    q1.enqueue([&] {
        q2.wait(event);
        seen = written;
    });
    q1.synchronize();
    CHECK(seen);

    // an error: the work after it is dropped, and the next wait throws it once
    bool after = false;
    q1.enqueue([] { throw tg::Error("broken on purpose"); });
    q1.enqueue([&] { after = true; });
    CHECK_THROWS(q1.synchronize(), "broken on purpose");
    CHECK(!after);
    q1.enqueue([&] { after = true; });
    q1.synchronize();
    CHECK(after);
}

// ---- DataParallel -----------------------------------------------------------------------------

TEST(data_parallel_splits_rows_first_devices_one_more) {
    CHECK_EQ(tg::DataParallel::split(10, 3), (std::vector<int64_t>{4, 3, 3}));
    CHECK_EQ(tg::DataParallel::split(12, 3), (std::vector<int64_t>{4, 4, 4}));
    CHECK_EQ(tg::DataParallel::split(5, 1), (std::vector<int64_t>{5}));
    CHECK_EQ(tg::DataParallel::split(3, 3), (std::vector<int64_t>{1, 1, 1}));
    CHECK_THROWS(tg::DataParallel::split(2, 3), "batch of 2 rows cannot be split over 3 devices");
}

// 1, 2 and 3 devices give the parameters of one device's jitted step within float rounding;
// a batch of 20 splits evenly over 2 devices and 7/7/6 over 3.
TEST_ON_CPU(data_parallel_matches_one_device) {
    std::vector<float> losses_one, losses_dp;
    std::vector<float> one = train_mlp({}, 5, 20, &losses_one);
    for (auto devices : {std::vector<std::string>{"CPU"}, {"CPU:0", "CPU:1"},
                         {"CPU", "CPU:1", "CPU:2"}}) {
        losses_dp.clear();
        std::vector<float> got = train_mlp(devices, 5, 20, &losses_dp);
        CHECK_ALL_NEAR(got, one, 2e-5);
        CHECK_ALL_NEAR(losses_dp, losses_one, 2e-6);
    }
    // one device runs the same sums as the jitted step, in the same order
    CHECK(same_bits(train_mlp({"CPU"}, 5, 20), one));
}

TEST_ON_CPU(data_parallel_gives_the_same_bits_every_run_and_thread_count) {
    std::vector<float> first = train_mlp({"CPU", "CPU:1", "CPU:2"}, 4, 19);
    CHECK(same_bits(train_mlp({"CPU", "CPU:1", "CPU:2"}, 4, 19), first));
    {
        EnvGuard threads("TG_THREADS", "1");
        CHECK(same_bits(train_mlp({"CPU", "CPU:1", "CPU:2"}, 4, 19), first));
    }
    {
        EnvGuard threads("TG_THREADS", "5");
        CHECK(same_bits(train_mlp({"CPU", "CPU:1", "CPU:2"}, 4, 19), first));
    }
}

// W2's model (the Bengio MLP: embedding, tanh, cross-entropy, SGD) and W3's (784-1024-1024-10
// ReLU MLP with biases, batches of 256 indices into a dataset), as shared/bench/WORKLOADS.md
// defines them: 2 devices give one device's parameters on the same global batches.
TEST_ON_CPU(data_parallel_trains_w2_and_w3_like_one_device) {
    auto w2 = [](const std::vector<std::string>& devices) {
        const int64_t V = 27, T = 3, E = 10, D = 200, B = 32;
        Tensor X = Tensor::from_vector(th::randi(size_t(256 * T), 5, 0, V - 1), {256, T});
        Tensor Y = Tensor::from_vector(th::randi(256, 6, 0, V - 1), {256});
        tg::manual_seed(3);
        nn::Embedding C(V, E);
        nn::Linear l1(T * E, D, false), l2(D, D, false), l3(D, V, false);
        std::vector<Tensor> params = {C.weight, l1.weight, l2.weight, l3.weight};
        optim::SGD opt(params, 0.01);
        auto loss_of = [&](const std::vector<Tensor>& in) {
            Tensor h = l2(l1(C(in[0]).reshape({-1, T * E})).tanh()).tanh();
            return nn::cross_entropy(l3(h), in[1]);
        };
        tg::Jit one = one_device_step(opt, loss_of);
        tg::DataParallel dp(devices.empty() ? std::vector<std::string>{"CPU"} : devices, opt,
                            loss_of);
        for (int s = 0; s < 4; s++) {
            std::vector<Tensor> in = {X.slice(0, s * B, (s + 1) * B),
                                      Y.slice(0, s * B, (s + 1) * B)};
            devices.empty() ? one(in) : dp(in);
        }
        return flat(params);
    };
    CHECK_ALL_NEAR(w2({"CPU", "CPU:1"}), w2({}), 1e-5);

    auto w3 = [](const std::vector<std::string>& devices) {
        Task task(1024, 784, 10, 9);
        tg::manual_seed(4);
        nn::Sequential mlp(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(),
                           nn::Linear(1024, 10));
        optim::SGD opt(mlp.parameters(), 0.01);
        auto loss_of = [&](const std::vector<Tensor>& in) {
            return nn::cross_entropy(mlp(task.X[in[0]]), task.Y[in[0]]);
        };
        tg::Jit one = one_device_step(opt, loss_of);
        tg::DataParallel dp(devices.empty() ? std::vector<std::string>{"CPU"} : devices, opt,
                            loss_of);
        for (int s = 0; s < 3; s++) {
            Tensor idx = Tensor::from_vector(th::randi(256, 20 + s, 0, 1023));
            devices.empty() ? one({idx}) : dp({idx});
        }
        return flat(mlp.parameters());
    };
    CHECK_ALL_NEAR(w3({"CPU", "CPU:1"}), w3({}), 1e-5);
}

// The first step on two devices compiles two programs, the shard's forward and backward and
// the update (which adds the second device's gradients to the first's): the second device
// prepares the same code. Three devices with shards of that size need one more, the merge of
// devices 0 and 1; the third device compiles nothing.
TEST_ON_CPU(data_parallel_compiles_each_program_once_for_every_device) {
    Task task(60, 7, 3, 21);   // shapes no other test uses: nothing is in the cache yet
    tg::manual_seed(2);
    nn::Linear layer(7, 3);
    optim::SGD opt(layer.parameters(), 0.1);
    auto loss_of = [&](const std::vector<Tensor>& s) {
        return nn::cross_entropy(layer(s[0]), s[1]);
    };
    tg::DataParallel two({"CPU", "CPU:1"}, opt, loss_of);
    tg::realize(layer.parameters());   // the initial values: a program of their own
    int64_t before = tg::stats().compiles;
    two({task.X.slice(0, 0, 14), task.Y.slice(0, 0, 14)});
    CHECK_EQ(tg::stats().compiles - before, int64_t(2));
    before = tg::stats().compiles;
    two({task.X.slice(0, 14, 28), task.Y.slice(0, 14, 28)});
    CHECK_EQ(tg::stats().compiles - before, int64_t(0));
    tg::DataParallel three({"CPU", "CPU:1", "CPU:2"}, opt, loss_of);
    three({task.X.slice(0, 0, 21), task.Y.slice(0, 0, 21)});
    CHECK_EQ(tg::stats().compiles - before, int64_t(1));
}

// A label out of range on the second device's rows fails its bounds check: the step stops
// before the update, so every parameter and the optimizer's state keep their bits, and the
// next step runs as if the bad batch had never come.
TEST_ON_CPU(data_parallel_error_on_one_device_updates_nothing) {
    auto run = [](bool with_bad_batch, std::vector<float>* at_error) {
        Task task(40, 6, 4, 31);
        tg::manual_seed(8);
        nn::Linear a(6, 8), b(8, 4);
        std::vector<Tensor> params = {a.weight, a.bias, b.weight, b.bias};
        optim::Adam opt(params, 0.05);
        tg::DataParallel dp({"CPU", "CPU:1"}, opt, [&](const std::vector<Tensor>& s) {
            return nn::cross_entropy(b(a(s[0]).relu()), s[1]);
        });
        dp({task.X.slice(0, 0, 10), task.Y.slice(0, 0, 10)});
        if (with_bad_batch) {
            std::vector<float> before = flat(params), state_before;
            for (auto& [name, t] : opt.state_dict())
                for (float v : values(t)) state_before.push_back(v);
            std::vector<int32_t> labels = {0, 1, 2, 3, 0, 1, 2, 3, 9, 1};   // 9: row 8, device 1
            CHECK_THROWS(dp({task.X.slice(0, 10, 20), Tensor::from_vector(labels)}),
                         "on CPU:1", "shard of 5 rows");
            std::vector<float> state_after;
            for (auto& [name, t] : opt.state_dict())
                for (float v : values(t)) state_after.push_back(v);
            CHECK(same_bits(flat(params), before));
            CHECK(same_bits(state_after, state_before));
            *at_error = before;
        }
        dp({task.X.slice(0, 20, 30), task.Y.slice(0, 20, 30)});
        return flat(params);
    };
    std::vector<float> at_error;
    CHECK(same_bits(run(true, &at_error), run(false, nullptr)));
    CHECK(!at_error.empty());
}

TEST_ON_CPU(data_parallel_refuses_what_it_cannot_split_or_merge) {
    Task task(20, 4, 3, 41);
    tg::manual_seed(1);
    nn::Linear layer(4, 3), unused(4, 4);
    optim::SGD opt(layer.parameters(), 0.1);
    auto loss_of = [&](const std::vector<Tensor>& s) {
        return nn::cross_entropy(layer(s[0]), s[1]);
    };
    tg::DataParallel dp({"CPU", "CPU:1"}, opt, loss_of);
    CHECK_THROWS(dp({task.X.slice(0, 0, 8), task.Y.slice(0, 0, 6)}), "batch tensors 0 and 1",
                 "[8,4]", "[6]");
    CHECK_THROWS(dp({task.X.slice(0, 0, 1), task.Y.slice(0, 0, 1)}),
                 "batch of 1 rows cannot be split over 2 devices");
    CHECK_THROWS(dp({Tensor::full({}, 1.0f)}), "batch tensor 0 is a scalar");
    CHECK_THROWS(tg::DataParallel({"CPU", "CPU:0"}, opt, loss_of), "device CPU is named twice");
    CHECK_THROWS(tg::DataParallel({"CPU:1", "CPU"}, opt, loss_of),
                 "parameter 0 ([3,4]) is on CPU", "first device, CPU:1");

    optim::SGD with_unused({layer.weight, unused.weight}, 0.1);
    tg::DataParallel dp_unused({"CPU", "CPU:1"}, with_unused, loss_of);
    CHECK_THROWS(dp_unused({task.X.slice(0, 0, 8), task.Y.slice(0, 0, 8)}), "parameter 1",
                 "[4,4]", "gets no gradient");

    tg::DataParallel stepping({"CPU", "CPU:1"}, opt, [&](const std::vector<Tensor>& s) {
        Tensor loss = loss_of(s);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
    CHECK_THROWS(stepping({task.X.slice(0, 0, 8), task.Y.slice(0, 0, 8)}),
                 "the loss writes a tensor in place", "must not call it");
    tg::Jit jitted([&](const std::vector<Tensor>& in) { return dp(in); });
    CHECK_THROWS(jitted({task.X.slice(0, 0, 8), task.Y.slice(0, 0, 8)}),
                 "DataParallel: a step cannot run inside a jitted function");
    std::vector<float> kept = flat(layer.parameters());
    dp({task.X.slice(0, 0, 8), task.Y.slice(0, 0, 8)});   // still works after the errors
    CHECK(!same_bits(flat(layer.parameters()), kept));
}

// all_reduce's function receives the first device's merged gradients before the update: with
// two "processes" that saw the same batch, summing is doubling, and the weights of 1/2 make
// the step that of one process.
TEST_ON_CPU(data_parallel_all_reduce_sums_over_processes) {
    auto run = [](bool two_processes) {
        Task task(24, 5, 3, 51);
        tg::manual_seed(6);
        nn::Linear layer(5, 3);
        optim::SGD opt(layer.parameters(), 0.3);
        tg::DataParallel dp({"CPU", "CPU:1"}, opt, [&](const std::vector<Tensor>& s) {
            return nn::cross_entropy(layer(s[0]), s[1]);
        });
        int calls = 0;
        if (two_processes)
            dp.all_reduce([&](const std::vector<Tensor>& grads) {
                calls++;
                CHECK_EQ(grads.size(), size_t(2));
                CHECK_EQ(grads[0].shape(), (tg::Shape{3, 5}));
                std::vector<Tensor> doubled;
                for (const Tensor& g : grads) doubled.push_back(g.assign(g * 2));
                tg::realize(doubled);
            }, 2);
        for (int s = 0; s < 3; s++)
            dp({task.X.slice(0, 8 * s, 8 * s + 8), task.Y.slice(0, 8 * s, 8 * s + 8)});
        CHECK_EQ(calls, two_processes ? 3 : 0);
        return flat(layer.parameters());
    };
    CHECK(same_bits(run(true), run(false)));
}

// A device whose memory the others do not read (as a GPU's): host memory behind the device
// interface, programs from the CPU. DataParallel then copies what the loss reads to it (again
// after every update) and copies its gradients into the receiver's merge buffers: the bits
// must be those of the direct reads between CPU devices.
namespace {
struct FarDevice : tg::detail::Device {
    std::string name_;
    explicit FarDevice(int k) : name_("FAR:" + std::to_string(k)) {}
    const char* name() const override { return name_.c_str(); }
    void* alloc(size_t bytes) override { return std::calloc(1, std::max<size_t>(bytes, 1)); }
    void free(void* p) override { std::free(p); }
    void copy_in(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
    void copy_out(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
    std::shared_ptr<tg::detail::Executable> prepare(const tg::detail::Program& p) override {
        return tg::detail::device("CPU").prepare(p);
    }
};
}  // namespace

TEST_ON_CPU(data_parallel_copies_to_devices_it_cannot_read) {
    tg::detail::register_device_kind("FAR", [](int k) -> tg::detail::Device* {
        return new FarDevice(k);
    });
    std::vector<float> direct = train_mlp({"CPU", "CPU:1", "CPU:2", "CPU:3", "CPU:4"}, 4, 23);
    std::vector<float> copied = train_mlp({"CPU", "FAR:1", "FAR:2", "CPU:3", "FAR:4"}, 4, 23);
    CHECK(same_bits(copied, direct));
    CHECK_ALL_NEAR(copied, train_mlp({}, 4, 23), 2e-5);
}

// Module::to moves a layer's parameters, buffers and gradients to another device in place:
// the handles taken before see them there with the same bits, and a step of an optimizer made
// after runs there as on the first device. What still points at the old storage is refused:
// a graph built before the move (a stale read), an optimizer made before, a jit traced before,
// a data-parallel step whose first device is the old one.
TEST_ON_CPU(module_to_moves_a_layer_in_place) {
    auto model_and_data = [](nn::Sequential& net, Task& task) {
        tg::manual_seed(31);
        net.add(std::make_shared<nn::Linear>(6, 8))
            .add(std::make_shared<nn::BatchNorm1d>(8))
            .add(std::make_shared<nn::ReLU>())
            .add(std::make_shared<nn::Linear>(8, 3));
        task = Task(10, 6, 3, 77);
    };
    auto loss_of = [](nn::Sequential& net, const Tensor& X, const Tensor& Y) {
        return nn::cross_entropy(net(X), Y);
    };
    nn::Sequential here, moved;
    Task task(1, 1, 2, 0), same(1, 1, 2, 0);
    model_and_data(here, task);
    model_and_data(moved, same);
    // one step on CPU for both, so that there are gradients and running statistics to move
    for (nn::Sequential* net : {&here, &moved}) loss_of(*net, task.X, task.Y).backward();
    Tensor weight = moved.at<nn::Linear>(0).weight;   // a handle taken before the move
    Tensor stale = weight * 2;
    optim::SGD before(moved.parameters(), 0.1);
    tg::Jit traced([&](const std::vector<Tensor>& in) { return moved(in[0]); });
    traced({task.X});
    tg::DataParallel two({"CPU", "CPU:1"}, before, [&](const std::vector<Tensor>& shard) {
        return loss_of(moved, shard[0], shard[1]);
    });
    here(task.X).realize();   // as the trace ran moved's: BatchNorm's statistics move alike

    CHECK(&moved.to("CPU:1") == &moved);
    for (auto& [name, t] : moved.state_dict()) CHECK_EQ(t.device(), std::string("CPU:1"));
    CHECK_EQ(weight.device(), std::string("CPU:1"));
    CHECK_EQ(weight.grad().device(), std::string("CPU:1"));
    CHECK(same_bits(values(weight.grad()), values(here.at<nn::Linear>(0).weight.grad())));
    CHECK(same_bits(flat(moved.parameters()), flat(here.parameters())));
    CHECK_THROWS(stale.realize(), "stale read");
    CHECK_THROWS(before.step(), "optimizer", "CPU:1", "Module::to");
    CHECK_THROWS(traced({task.X}), "jit", "moved");
    CHECK_THROWS(two({task.X, task.Y}), "DataParallel", "parameter 0", "CPU:1");

    optim::SGD on_cpu(here.parameters(), 0.1), on_cpu1(moved.parameters(), 0.1);
    on_cpu.step();
    on_cpu1.step();
    Tensor a = loss_of(here, task.X, task.Y);
    Tensor b = loss_of(moved, task.X.to("CPU:1"), task.Y.to("CPU:1"));
    CHECK_EQ(b.device(), std::string("CPU:1"));
    CHECK(same_bits(values(a), values(b)));
    CHECK(same_bits(flat(moved.parameters()), flat(here.parameters())));
    CHECK(same_bits(values(moved.at<nn::BatchNorm1d>(1).running_mean),
                    values(here.at<nn::BatchNorm1d>(1).running_mean)));
    CHECK_THROWS(moved.to("NOPE"), "unknown device");
}
