// Cache-hit latency over loopback: N concurrent clients, each with its own
// channel (TLS and a token when given), send Compile(cache_only) (with
// --mixed, every other client sends Lookup) for one tuned workload for a
// fixed time, each waiting for its answer before sending the next; prints a
// markdown row: label, clients, requests per second, p50, p99 and max
// latency, and the failed requests by status code. A client is a thread
// making blocking calls (fusor::client::Client), or with --callback a chain
// of calls on gRPC's callback API, all clients sharing gRPC's threads.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_format.h"
#include "client/client.h"
#include "proto/wire/cli_flags.h"
#include "proto/wire/grpc_status.h"

int main(int argc, char** argv) {
  CLI::App app{"fusor cache-hit Compile benchmark"};
  std::string server, file;
  int clients = 8;
  double seconds = 10, warmup_s = 1;
  app.add_option("--server", server, "scheduler address")->required();
  app.add_option("--workload", file, "a workload already in the cache")->required();
  app.add_option("--clients", clients, "concurrent clients")->capture_default_str();
  app.add_option("--seconds", seconds, "measured duration")->capture_default_str();
  std::string label = "plaintext", token;
  app.add_option("--label", label, "first column of the row")->capture_default_str();
  app.add_option("--token", token, "a client token");
  fusor::wire::ClientTls tls;
  fusor::wire::AddClientTlsFlags(app, tls);
  bool header = false, mixed = false, callback = false;
  app.add_flag("--mixed", mixed, "every other client sends Lookup instead of Compile");
  app.add_flag("--callback", callback, "clients on gRPC's callback API instead of a thread each");
  app.add_flag("--header", header, "print the table's header first");
  CLI11_PARSE(app, argc, argv);

  auto workload = fusor::client::ReadWorkloadFile(file);
  if (!workload.ok()) {
    std::cerr << workload.status() << "\n";
    return 1;
  }
  fusor::v1::CompileRequest req;
  *req.mutable_workload() = *workload;
  req.set_cache_only(true);
  fusor::v1::LookupRequest lookup;
  *lookup.mutable_workload() = *workload;

  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> latencies(clients);
  std::atomic<int> errors{0};
  std::mutex codes_mu;
  std::map<std::string, int> codes;  // failed requests by status code
  std::atomic<bool> measuring{false};
  const auto start = Clock::now();
  const auto begin_measure = start + std::chrono::duration<double>(warmup_s);
  const auto end = begin_measure + std::chrono::duration<double>(seconds);
  // Records one answer; false when the client should stop.
  auto record = [&](int c, Clock::time_point t0, const absl::StatusOr<fusor::v1::TuneResult>& result) {
    auto t1 = Clock::now();
    if (!result.ok() || !result->from_cache()) {
      ++errors;
      std::lock_guard<std::mutex> lock(codes_mu);
      codes[result.ok() ? "not from cache" : absl::StatusCodeToString(result.status().code())]++;
    } else if (t0 >= begin_measure) {
      latencies[c].push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    return t1 < end;
  };
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < clients; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("fusor.bench.client", c);  // a distinct channel (connection) per client
    args.SetMaxReceiveMessageSize(64 << 20);
    auto channel = fusor::wire::Dial(server, token, tls, args);
    if (!channel.ok()) {
      std::cerr << channel.status() << "\n";
      return 1;
    }
    channels.push_back(*channel);
  }
  if (callback) {
    // One call in flight per client: each answer's callback sends the next.
    struct Call {
      grpc::ClientContext ctx;
      fusor::v1::CompileResponse compiled;
      fusor::v1::LookupResponse looked_up;
      Clock::time_point t0;
    };
    std::vector<std::unique_ptr<fusor::v1::Scheduler::Stub>> stubs;
    for (auto& channel : channels) stubs.push_back(fusor::v1::Scheduler::NewStub(channel));
    std::mutex done_mu;
    std::condition_variable done_cv;
    int running = clients, live = 0;  // clients still sending; calls not yet destroyed
    std::function<void(int)> send = [&](int c) {
      {
        std::lock_guard<std::mutex> lock(done_mu);
        ++live;
      }
      // Destroyed on a gRPC thread after the last callback: waited for too.
      std::shared_ptr<Call> call(new Call, [&](Call* done) {
        delete done;
        std::lock_guard<std::mutex> lock(done_mu);
        if (--live == 0) done_cv.notify_one();
      });
      call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      call->t0 = Clock::now();
      auto next = [&, c, call](const absl::StatusOr<fusor::v1::TuneResult>& result) {
        if (record(c, call->t0, result)) return send(c);
        std::lock_guard<std::mutex> lock(done_mu);
        if (--running == 0) done_cv.notify_one();
      };
      if (mixed && c % 2 == 1) {
        stubs[c]->async()->Lookup(&call->ctx, &lookup, &call->looked_up, [call, next](grpc::Status st) {
          next(st.ok() ? absl::StatusOr<fusor::v1::TuneResult>(call->looked_up.result())
                       : fusor::wire::FromGrpcStatus(st));
        });
      } else {
        stubs[c]->async()->Compile(&call->ctx, &req, &call->compiled, [call, next](grpc::Status st) {
          next(st.ok() ? absl::StatusOr<fusor::v1::TuneResult>(call->compiled.result())
                       : fusor::wire::FromGrpcStatus(st));
        });
      }
    };
    for (int c = 0; c < clients; ++c) send(c);
    std::unique_lock<std::mutex> lock(done_mu);
    done_cv.wait(lock, [&] { return running == 0 && live == 0; });
  }
  std::vector<std::thread> threads;
  for (int c = 0; c < clients && !callback; ++c) {
    threads.emplace_back([&, c] {
      fusor::client::Client client(channels[c]);
      for (bool more = true; more;) {
        auto t0 = Clock::now();
        absl::StatusOr<fusor::v1::TuneResult> result;
        if (mixed && c % 2 == 1) {
          auto resp = client.Lookup(lookup);
          if (resp.ok()) result = resp->result(); else result = resp.status();
        } else {
          auto resp = client.Compile(req, absl::Seconds(10));
          if (resp.ok()) result = resp->result(); else result = resp.status();
        }
        more = record(c, t0, result);
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  if (all.empty()) {
    std::cerr << "no successful requests (" << errors << " errors)\n";
    return 1;
  }
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) { return all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))]; };
  std::cerr << absl::StrFormat("%s: %d clients, %.0f s: %zu requests, %d errors\n", label, clients, seconds,
                               all.size(), errors.load());
  std::string failed;
  for (const auto& [code, n] : codes) failed += absl::StrFormat("%s%d %s", failed.empty() ? "" : ", ", n, code);
  if (header) {
    std::cout << "| setup | clients | requests/s | p50 | p99 | max | failed |\n|---|---:|---:|---:|---:|---:|---|\n";
  }
  std::cout << absl::StrFormat("| %s | %d | %.0f | %.2f ms | %.2f ms | %.1f ms | %s |\n", label, clients,
                               all.size() / seconds, pct(0.50) * 1e3, pct(0.99) * 1e3, all.back() * 1e3,
                               failed.empty() ? "0" : failed);
  return errors > 0 ? 1 : 0;
}
