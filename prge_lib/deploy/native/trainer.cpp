// The P-RGE training loop of chapter 10 in C++: what the native layer of an Android app or a Jetson program
// contains. It loads the training program written by `prge export`, feeds it the batch, seeds, lr and eps of
// every step from a batch file, threads the adapter from one step to the next, refuses a step whose losses are
// not finite, and keeps the adapter in a file between runs. Nothing here depends on Python.
//
//   prge-trainer PROGRAM.pte BATCHES.bin ADAPTER.bin LOG.tsv [--save-every N]
//
// ADAPTER.bin is read when it exists (training continues after the step it was saved at) and written at the
// end, every N steps with --save-every, and when a step is refused. LOG.tsv gets one line per step: the step,
// whether it was kept, its seconds and the 2q losses. The last line on stdout is a JSON summary.
// Exit status: 0 done; 1 bad input (one line on stderr naming the file and the fix); 3 a step was refused.

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/platform/platform.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::extension::Module;
using executorch::extension::make_tensor_ptr;
using executorch::runtime::Program;

namespace {

// One line for stderr and the exit status; main() prints it.
struct Failure : std::runtime_error {
  int status;
  Failure(const std::string& line, int status = 1) : std::runtime_error(line), status(status) {}
};

// ## log
// The runtime reports through its platform layer. Keep its last error, so that our own one-line message can
// say why a load failed, and drop the rest (XNNPACK's CPU probe logs a line per file it reads).
std::string runtime_said;

void keep_errors(et_timestamp_t, et_pal_log_level_t level, const char*, const char*, size_t,
                 const char* message, size_t length) {
  if (level == kError || level == kFatal) {
    runtime_said.assign(message, length);
    while (!runtime_said.empty() && std::isspace(static_cast<unsigned char>(runtime_said.back()))) {
      runtime_said.pop_back();
    }
    for (char& c : runtime_said) c = c == '\n' ? ' ' : c;  // our message stays one line
  }
}

std::string because(executorch::runtime::Error error) {
  std::string why = executorch::runtime::to_string(error);
  return runtime_said.empty() ? why : why + ": " + runtime_said;
}

// ## batches
// The batch file (little-endian), written by prge_lib.native_host.write_batches:
//   "PRGEBAT1", then int64 first_step, steps, rows, width, target_width, q, adapter_size;
//   per step: int64 step, input_ids[rows*width], attention_mask[rows*width], targets[rows*target_width],
//             seeds[q]; float32 lr, eps.
struct Header {
  int64_t first_step, steps, rows, width, target_width, q, adapter_size;
};

struct Step {
  int64_t t;
  std::vector<int64_t> ids, mask, targets, seeds;
  float lr, eps;
};

class BatchFile {
 public:
  explicit BatchFile(const std::string& path) : path_(path), in_(path, std::ios::binary | std::ios::ate) {
    if (!in_) throw Failure(path + ": cannot open the batch file; write it with `prge device-train --host native`");
    const int64_t size = in_.tellg();
    in_.seekg(0);
    char magic[8] = {};
    in_.read(magic, 8);
    int64_t* fields[] = {&h.first_step, &h.steps, &h.rows, &h.width, &h.target_width, &h.q, &h.adapter_size};
    for (int64_t* field : fields) in_.read(reinterpret_cast<char*>(field), 8);
    if (!in_ || std::memcmp(magic, "PRGEBAT1", 8) != 0) {
      throw Failure(path + ": not a P-RGE batch file (no PRGEBAT1 header); write it again with "
                    "prge_lib.native_host.write_batches");
    }
    if (h.first_step < 0 || h.steps < 0 || h.rows < 1 || h.width < 1 || h.target_width < 1 || h.q < 1 ||
        h.adapter_size < 1 || h.rows * h.width > (1 << 24) || h.q > (1 << 16)) {
      throw Failure(path + ": the header's sizes are impossible (corrupt file); write it again");
    }
    record_ = 8 * (1 + 2 * h.rows * h.width + h.rows * h.target_width + h.q) + 2 * 4;
    if (size != kHeaderBytes + h.steps * record_) {
      throw Failure(path + ": " + std::to_string(size) + " bytes, but its header announces " +
                    std::to_string(h.steps) + " steps of " + std::to_string(record_) +
                    " bytes (truncated or corrupt); write it again");
    }
  }

  Step read(int64_t t) {  // the inputs of step t
    in_.seekg(kHeaderBytes + (t - h.first_step) * record_);
    Step s{0, std::vector<int64_t>(h.rows * h.width), std::vector<int64_t>(h.rows * h.width),
           std::vector<int64_t>(h.rows * h.target_width), std::vector<int64_t>(h.q), 0.f, 0.f};
    in_.read(reinterpret_cast<char*>(&s.t), 8);
    for (auto* part : {&s.ids, &s.mask, &s.targets, &s.seeds}) {
      in_.read(reinterpret_cast<char*>(part->data()), 8 * part->size());
    }
    in_.read(reinterpret_cast<char*>(&s.lr), 4);
    in_.read(reinterpret_cast<char*>(&s.eps), 4);
    if (!in_ || s.t != t) throw Failure(path_ + ": the record of step " + std::to_string(t) + " is corrupt; write it again");
    return s;
  }

  Header h{};

 private:
  static constexpr int64_t kHeaderBytes = 8 + 7 * 8;
  std::string path_;
  std::ifstream in_;
  int64_t record_ = 0;
};

// ## check
// The program's input signature (prge_lib.program.TrainStep) against the batch file's shapes: a program
// exported for other settings is refused before the first step, naming both.
void check_program(Module& module, const Header& h, const std::string& pte, const std::string& batches) {
  auto meta = module.method_meta("forward");
  if (!meta.ok()) throw Failure(pte + ": no forward method (" + because(meta.error()) + "); export it with `prge export`");
  const char* names[] = {"input_ids", "attention_mask", "targets", "adapter", "seeds", "lr", "eps"};
  const std::vector<std::vector<int64_t>> shapes = {
      {h.rows, h.width}, {h.rows, h.width}, {h.rows, h.target_width}, {h.adapter_size}, {h.q}, {}, {}};
  const ScalarType types[] = {ScalarType::Long,  ScalarType::Long,  ScalarType::Long, ScalarType::Float,
                              ScalarType::Long,  ScalarType::Float, ScalarType::Float};
  if (meta->num_inputs() != 7) {
    throw Failure(pte + ": takes " + std::to_string(meta->num_inputs()) +
                  " inputs, not the 7 of a P-RGE training step; export it with `prge export`");
  }
  for (size_t i = 0; i < 7; ++i) {
    auto info = meta->input_tensor_meta(i);
    if (!info.ok()) throw Failure(pte + ": input " + names[i] + " is not a tensor; export it with `prge export`");
    std::vector<int64_t> sizes(info->sizes().begin(), info->sizes().end());
    if (sizes != shapes[i] || info->scalar_type() != types[i]) {
      auto text = [](const std::vector<int64_t>& v) {
        std::string s = "(";
        for (size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::to_string(v[k]);
        return s + ")";
      };
      throw Failure(pte + ": takes " + names[i] + " of shape " + text(sizes) + ", but " + batches + " holds " +
                    text(shapes[i]) + ": the batches were written for another program; write them for this one");
    }
  }
}

// ## adapter
// The adapter file: "PRGEADP1", int64 step (the steps done), int64 size, float32[size]. Written to a temporary
// file and renamed, so that an app killed mid-write keeps the previous adapter.
int64_t read_adapter(const std::string& path, std::vector<float>& adapter) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  int64_t step = -1, size = -1;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&step), 8);
  in.read(reinterpret_cast<char*>(&size), 8);
  if (!in || std::memcmp(magic, "PRGEADP1", 8) != 0 || step < 0) {
    throw Failure(path + ": not an adapter file (no PRGEADP1 header); delete it to start from zeros");
  }
  if (size != static_cast<int64_t>(adapter.size())) {
    throw Failure(path + ": an adapter of " + std::to_string(size) + " floats, the program's has " +
                  std::to_string(adapter.size()) + "; use the adapter of this program or delete it");
  }
  in.read(reinterpret_cast<char*>(adapter.data()), 4 * size);
  if (!in) throw Failure(path + ": truncated adapter file; delete it to start from zeros");
  return step;
}

void write_adapter(const std::string& path, const std::vector<float>& adapter, int64_t step) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    const int64_t size = adapter.size();
    out.write("PRGEADP1", 8);
    out.write(reinterpret_cast<const char*>(&step), 8);
    out.write(reinterpret_cast<const char*>(&size), 8);
    out.write(reinterpret_cast<const char*>(adapter.data()), 4 * size);
    if (!out) throw Failure(tmp + ": cannot write the adapter; check the folder and free space");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Failure(path + ": cannot replace the adapter file");
}

// ## step
// One training step is one call: batch, adapter, seeds, lr and eps in; losses (2, q) and the next adapter out.
// The tensors wrap this host's buffers without copying. The outputs live in the program's planned memory and
// are overwritten by the next call, so the next adapter is copied out, and only when every loss is finite.
bool train_step(Module& module, const Header& h, Step& s, std::vector<float>& adapter, std::vector<float>& losses) {
  auto ids = make_tensor_ptr({SizesType(h.rows), SizesType(h.width)}, s.ids.data(), ScalarType::Long);
  auto mask = make_tensor_ptr({SizesType(h.rows), SizesType(h.width)}, s.mask.data(), ScalarType::Long);
  auto targets = make_tensor_ptr({SizesType(h.rows), SizesType(h.target_width)}, s.targets.data(), ScalarType::Long);
  auto state = make_tensor_ptr({SizesType(h.adapter_size)}, adapter.data(), ScalarType::Float);
  auto seeds = make_tensor_ptr({SizesType(h.q)}, s.seeds.data(), ScalarType::Long);
  auto lr = make_tensor_ptr(std::vector<SizesType>{}, &s.lr, ScalarType::Float);
  auto eps = make_tensor_ptr(std::vector<SizesType>{}, &s.eps, ScalarType::Float);
  auto out = module.forward({ids, mask, targets, state, seeds, lr, eps});
  if (!out.ok()) throw Failure("step " + std::to_string(s.t) + ": the program failed (" + because(out.error()) + ")");
  const auto& l = (*out)[0].toTensor();
  const auto& next = (*out)[1].toTensor();
  losses.assign(l.const_data_ptr<float>(), l.const_data_ptr<float>() + l.numel());
  for (float v : losses) {
    if (!std::isfinite(v)) return false;
  }
  std::memcpy(adapter.data(), next.const_data_ptr<float>(), 4 * adapter.size());
  return true;
}

// ## memory
// This process's resident memory in MiB (VmRSS now, VmHWM its peak), from /proc/self/status.
double resident_mib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field) + 1)) / 1024;
  }
  return -1;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ## main
int train(int argc, char** argv) {
  if (argc != 5 && !(argc == 7 && std::string(argv[5]) == "--save-every")) {
    throw Failure("usage: prge-trainer PROGRAM.pte BATCHES.bin ADAPTER.bin LOG.tsv [--save-every N]");
  }
  const std::string pte = argv[1], batch_path = argv[2], adapter_path = argv[3], log_path = argv[4];
  const int64_t save_every = argc == 7 ? std::atoll(argv[6]) : 0;
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(keep_errors, __FILE__));
  const double before_load = resident_mib("VmRSS:");

  BatchFile batches(batch_path);
  const Header& h = batches.h;

  // ## load
  if (!std::ifstream(pte)) throw Failure(pte + ": cannot open the program; write it with `prge export`");
  auto start = std::chrono::steady_clock::now();
  Module module(pte, Module::LoadMode::Mmap);  // the weights are paged in from the file, not copied
  if (auto error = module.load(Program::Verification::InternalConsistency); error != executorch::runtime::Error::Ok) {
    throw Failure(pte + ": not a valid ExecuTorch program (" + because(error) + "); export it again with `prge export`");
  }
  check_program(module, h, pte, batch_path);
  if (auto error = module.load_forward(); error != executorch::runtime::Error::Ok) {
    throw Failure(pte + ": cannot load its forward method (" + because(error) + "); export it again with `prge export`");
  }
  const double load_s = seconds_since(start);

  // ## loop
  std::vector<float> adapter(h.adapter_size, 0.f), losses;  // LoRA's B starts at zero
  int64_t t = h.first_step;
  const bool continuing = static_cast<bool>(std::ifstream(adapter_path));
  if (continuing) t = read_adapter(adapter_path, adapter);
  const int64_t first = t, end = h.first_step + h.steps;
  if (t < h.first_step || t > end) {
    throw Failure(adapter_path + ": saved after step " + std::to_string(t) + ", but " + batch_path + " holds steps " +
                  std::to_string(h.first_step) + " to " + std::to_string(end - 1) + "; write the batches from step " +
                  std::to_string(t));
  }
  std::ofstream log(log_path, continuing ? std::ios::app : std::ios::trunc);
  if (!log) throw Failure(log_path + ": cannot write the step log; check the folder");
  double after_first = -1;
  for (; t < end; ++t) {
    Step s = batches.read(t);
    start = std::chrono::steady_clock::now();
    const bool finite = train_step(module, h, s, adapter, losses);
    const double took = seconds_since(start);
    log << t << '\t' << finite << '\t' << took;
    char value[32];
    for (float v : losses) {
      std::snprintf(value, sizeof value, "\t%.9g", v);  // 9 digits: every float32 exactly
      log << value;
    }
    log << '\n' << std::flush;
    if (after_first < 0) after_first = resident_mib("VmRSS:");
    if (!finite) {
      write_adapter(adapter_path, adapter, t);
      throw Failure("step " + std::to_string(t) + ": a loss is not finite; the update was refused and the adapter "
                    "from before it is kept in " + adapter_path + "; lower the learning rate or eps", 3);
    }
    if (save_every > 0 && (t + 1) % save_every == 0) write_adapter(adapter_path, adapter, t + 1);
  }
  write_adapter(adapter_path, adapter, end);
  std::printf("{\"steps\": %lld, \"first_step\": %lld, \"load_s\": %.6f, \"resident_before_load_mib\": %.1f, "
              "\"resident_after_first_step_mib\": %.1f, \"peak_resident_mib\": %.1f}\n",
              static_cast<long long>(end - first), static_cast<long long>(first), load_s, before_load, after_first,
              resident_mib("VmHWM:"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return train(argc, argv);
  } catch (const Failure& failure) {
    std::fprintf(stderr, "prge-trainer: %s\n", failure.what());
    return failure.status;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "prge-trainer: %s\n", error.what());
    return 1;
  }
}
