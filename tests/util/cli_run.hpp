// Running the project's command-line tools (pagedkv-replay, pagedkv-tiny-engine) from tests, and
// reading fields out of their one-line JSON results.
//
// Contract: run_cli blocks until the child exits; stderr is merged into the captured output. The
// JSON readers are deliberately small (they find the first `"name":` at or after `from`) and are
// meant for the tools' own flat output only. Not thread-safe (popen).
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace pagedkv::test {

struct CliRun {
  int exit_code = -1;  // the child's exit status; -1 when it did not exit normally
  std::string output;  // stdout and stderr
  double seconds = 0;  // wall time of the run
};

// Runs `program args` through the shell and waits for it.
inline CliRun run_cli(const std::string& program, const std::string& args) {
  CliRun r;
  const std::string command = program + " " + args + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) r.output += buf;
  const int status = pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The unsigned integer after "\"name\":", or -1 when absent or not an unsigned integer.
inline long long json_uint(const std::string& json, const std::string& name) {
  const std::string key = "\"" + name + "\":";
  const auto at = json.find(key);
  if (at == std::string::npos) return -1;
  std::size_t i = at + key.size();
  if (i >= json.size() || json[i] < '0' || json[i] > '9') return -1;
  long long v = 0;
  while (i < json.size() && json[i] >= '0' && json[i] <= '9') v = v * 10 + (json[i++] - '0');
  return v;
}

// The number after "\"name\":" at or after `from`; NaN when absent.
inline double json_number(const std::string& json, const std::string& name, std::size_t from = 0) {
  const std::string key = "\"" + name + "\":";
  const auto at = json.find(key, from);
  if (at == std::string::npos) return std::nan("");
  const char* begin = json.c_str() + at + key.size();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  return end == begin ? std::nan("") : v;
}

// The string value of "\"name\":\"...\"", or "" when absent.
inline std::string json_text(const std::string& json, const std::string& name) {
  const std::string key = "\"" + name + "\":\"";
  const auto at = json.find(key);
  if (at == std::string::npos) return "";
  const auto end = json.find('"', at + key.size());
  return end == std::string::npos ? "" : json.substr(at + key.size(), end - at - key.size());
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace pagedkv::test
