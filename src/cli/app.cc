// The osprey command line: argument parsing (CLI11) and the error boundary. Subcommands live in src/cli/*.cc; main.cc
// and the Python package's `python -m osprey` call RunCommandLine, each saying how `serve` runs (common.h).
#include <CLI/CLI.hpp>
#include <climits>
#include <iostream>
#include <new>

#include "cli/augment.h"
#include "cli/classify.h"
#include "cli/common.h"
#include "cli/decode.h"
#include "cli/heads.h"

namespace osprey::cli {

int RunCommandLine(int argc, char** argv, const ServeCommand& serve_command) {
  CLI::App app{"osprey: an ONNX inference engine for CPUs", "osprey"};
  app.set_version_flag("--version", std::string("osprey ") + osprey::kOspreyVersion);
  app.require_subcommand(1);

  InspectOptions inspect_options;
  CLI::App* inspect = app.add_subcommand("inspect", "Show a model's inputs, outputs, op histogram and parameters");
  inspect->add_option("model", inspect_options.model, "ONNX model file")->required();
  inspect->add_flag("--json", inspect_options.json, "Print one JSON object");

  RunOptions run_options;
  CLI::App* run = app.add_subcommand("run", "Run a model once and write its outputs as .npy files");
  run->add_option("model", run_options.model, "ONNX model file")->required();
  run->add_option("--input,-i", run_options.inputs, "Input NAME=FILE.npy (repeatable)")->allow_extra_args(false);
  run->add_flag("--random-inputs", run_options.random_inputs,
                "Fill inputs not given with --input: uniform [0,1) floats, zero integers");
  run->add_option("--seed", run_options.seed, "Seed for --random-inputs")->capture_default_str();
  run->add_option("--dims", run_options.dims, "SYMBOL=N for symbolic dims of random inputs (default 1; repeatable)")
      ->allow_extra_args(false);
  run->add_option("--output-dir,-o", run_options.output_dir, "Directory for <output name>.npy files")->required();
  run->add_option("--threads", run_options.threads, "Intra-op threads (0 = all cores)")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  run->add_flag("--reference", run_options.reference, "Use reference kernels only, no graph fusion");
  run->add_option("--precision", run_options.precision, kPrecisionHelp)
      ->check(CLI::IsMember(PrecisionNames()))
      ->capture_default_str();
  run->add_option("--device", run_options.device, kDeviceHelp)->capture_default_str();

  BenchOptions bench_options;
  CLI::App* bench = app.add_subcommand("bench", "Time a model on random inputs (or given ones)");
  bench->add_option("model", bench_options.model, "ONNX model file")->required();
  bench->add_option("--batch", bench_options.batch, "Batch size for a symbolic first dim (default 1)")
      ->check(CLI::Range(1, INT_MAX));
  bench->add_option("--threads", bench_options.threads, "Intra-op threads (0 = all cores)")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  bench->add_option("--warmup", bench_options.warmup, "Untimed runs after the first")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  bench->add_option("--iters", bench_options.iters, "Timed runs")->check(CLI::Range(1, INT_MAX))->capture_default_str();
  bench->add_option("--seed", bench_options.seed, "Seed for the random inputs")->capture_default_str();
  bench->add_option("--input,-i", bench_options.inputs, "Input NAME=FILE.npy instead of a random one (repeatable)")
      ->allow_extra_args(false);
  bench->add_option("--dims", bench_options.dims, "SYMBOL=N for other symbolic dims (default 1; repeatable)")
      ->allow_extra_args(false);
  bench->add_flag("--json", bench_options.json, "Print one JSON object");
  bench->add_flag("--profile", bench_options.profile, "Time each op; print time per op type and the slowest nodes");
  bench->add_option("--top", bench_options.top, "With --profile: how many of the slowest nodes to list (0 = all)")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  bench->add_option("--streams", bench_options.streams, "Throughput mode: S threads running the model at once")
      ->check(CLI::Range(1, 1024));
  bench
      ->add_option("--gap-ms", bench_options.gap_ms,
                   "Idle this long before each timed run (not timed): the latency of requests that arrive after a "
                   "pause, as a server's do, instead of back to back")
      ->check(CLI::Range(0.0, 60000.0))
      ->capture_default_str();
  bench->add_flag("--reference", bench_options.reference, "Use reference kernels only, no graph fusion");
  bench
      ->add_option("--precision", bench_options.precision, kPrecisionHelp)
      ->check(CLI::IsMember(PrecisionNames()))
      ->capture_default_str();
  bench->add_option("--device", bench_options.device, kDeviceHelp)->capture_default_str();

  CLI::App* decode = AddDecodeCommand(app);
  CLI::App* serve = serve_command.add(app);
  CLI::App* augment = AddAugmentCommand(app);
  CLI::App* heads = AddHeadsCommand(app);

  ClassifyOptions classify_options;
  CLI::App* classify = app.add_subcommand("classify", "Classify images with a model directory (top-k labels)");
  classify->add_option("model_dir", classify_options.model_dir, "Model directory (<name> or <name>/<version>) or .onnx")
      ->required();
  classify->add_option("images", classify_options.images, "Image files (JPEG, PNG, WebP, BMP)")->required();
  classify->add_option("--top-k,-k", classify_options.top_k, "Classes per image (default: config.json's top_k)")
      ->check(CLI::Range(1, INT_MAX));
  classify->add_flag("--json", classify_options.json, "Print one JSON object");
  classify->add_option("--threads", classify_options.threads, "Intra-op threads (0 = all cores)")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  classify->add_option("--batch-size", classify_options.batch_size, "Images per model run")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  classify->add_option("--model-version", classify_options.version, "Version directory (default: the highest)");
  classify->add_option("--device", classify_options.device, kDeviceHelp)->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // CLI11 checks required options before it reports unknown ones: `run M --out-dir D` said "--output-dir is
    // required". An argument it could not place is the likelier mistake, so it is named first.
    std::string unknown, message = e.what();
    for (const CLI::App* sub : app.get_subcommands())
      for (const std::string& arg : sub->remaining())
        if (unknown.empty() && arg.size() > 1 && arg[0] == '-') unknown = arg;
    if (!unknown.empty() && e.get_name() == "RequiredError") message = "unknown option " + unknown + "; " + message;
    std::cerr << "osprey: error: " << message << "\n"
              << "Run 'osprey --help' or 'osprey <command> --help' for usage.\n";
    return 2;
  }

  try {
    if (*inspect) return RunInspect(inspect_options, std::cout);
    if (*run) return RunRun(run_options, std::cout);
    if (*bench) return RunBench(bench_options, std::cout);
    if (*classify) return RunClassify(classify_options, std::cout, std::cerr);
    if (*decode) return RunDecodeCommand(std::cout);
    if (*serve) return serve_command.run();
    if (*augment) return RunAugmentCommand(std::cout, std::cerr);
    if (*heads) return RunHeadsCommand(std::cout, std::cerr);
  } catch (const osprey::Error& e) {
    std::cout.flush();
    std::cerr << "osprey: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cout.flush();
    std::cerr << "osprey: error: out of memory: the input or a parameter asks for more memory than this machine has\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "osprey: error: " << e.what() << "\n";
    return 1;
  }
  return 2;
}

}  // namespace osprey::cli
