// python/src/publisher.cpp: KVEventPublisher (vLLM's ZmqEventPublisher in C++), built when the
// events layer is (PAGEDKV_PYTHON_HAS_EVENTS).
//
// publish(events) takes the Python event objects a manager's take_events() returned;
// publish_from(manager) takes the manager's pending events directly, without creating Python
// objects (the cheap path, once per scheduler step).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "objects.hpp"
#include "pagedkv/events/publisher.hpp"

namespace pagedkv::python {

namespace {

using events::KVEventPublisher;
using events::KVEventPublisherConfig;
using events::KVEventPublisherStats;

struct PyPublisher {
  std::unique_ptr<KVEventPublisher> pub;

  KVEventPublisher& get() {
    if (!pub) throw Error(ErrorCode::kInvalidState, "KVEventPublisher: already shut down");
    return *pub;
  }
};

events::HashFormat hash_format_from(const std::string& s) {
  if (s == "int64") return events::HashFormat::kInt64;
  if (s == "bytes") return events::HashFormat::kBytes;
  throw Error(ErrorCode::kInvalidArgument,
              "KVEventPublisher: hash_format must be 'int64' or 'bytes', got '" + s + "'");
}

events::EventEncoding encoding_from(const std::string& s) {
  if (s == "array_like") return events::EventEncoding::kArrayLike;
  if (s == "map") return events::EventEncoding::kMap;
  throw Error(ErrorCode::kInvalidArgument,
              "KVEventPublisher: encoding must be 'array_like' or 'map', got '" + s + "'");
}

py::object seq_or_none(const std::optional<std::uint64_t>& seq) {
  return seq ? py::object(py::int_(*seq)) : py::object(py::none());
}

}  // namespace

void bind_publisher(py::module_& m) {
  py::class_<KVEventPublisherStats>(m, "KVEventPublisherStats")
      .def_readonly("published_batches", &KVEventPublisherStats::published_batches)
      .def_readonly("sent_batches", &KVEventPublisherStats::sent_batches)
      .def_readonly("dropped_batches", &KVEventPublisherStats::dropped_batches)
      .def_readonly("encode_failures", &KVEventPublisherStats::encode_failures)
      .def_readonly("send_failures", &KVEventPublisherStats::send_failures)
      .def_readonly("replays_served", &KVEventPublisherStats::replays_served)
      .def_readonly("probes_served", &KVEventPublisherStats::probes_served)
      .def_readonly("queued", &KVEventPublisherStats::queued)
      .def("__repr__", [](const KVEventPublisherStats& s) {
        return "KVEventPublisherStats(published_batches=" + std::to_string(s.published_batches) +
               ", sent_batches=" + std::to_string(s.sent_batches) +
               ", dropped_batches=" + std::to_string(s.dropped_batches) + ")";
      });

  py::class_<PyPublisher>(
      m, "KVEventPublisher",
      "vLLM's ZmqEventPublisher: a PUB socket sends (topic, 8-byte big-endian seq, msgpack "
      "KVEventBatch) per published batch; an optional ROUTER socket serves replays. publish() "
      "never blocks on I/O (a bounded queue; overflow drops the oldest batch and counts it).")
      .def(py::init([](std::string endpoint, std::optional<bool> bind,
                       std::optional<std::string> replay_endpoint, py::handle buffer_steps,
                       py::handle hwm, py::handle max_queue_size, std::string topic,
                       std::string hash_format, std::string encoding, std::string medium,
                       py::handle data_parallel_rank,
                       std::optional<std::vector<AttentionSpec>> groups,
                       std::optional<BlockHasher> probe_hasher, py::handle linger_ms) {
             KVEventPublisherConfig c;
             c.endpoint = std::move(endpoint);
             c.bind = bind;
             c.replay_endpoint = std::move(replay_endpoint);
             c.buffer_steps = to_integer<std::size_t>(buffer_steps, "buffer_steps");
             c.hwm = to_integer<int>(hwm, "hwm");
             c.max_queue_size = to_integer<std::size_t>(max_queue_size, "max_queue_size");
             c.topic = std::move(topic);
             c.wire.hash_format = hash_format_from(hash_format);
             c.wire.encoding = encoding_from(encoding);
             c.wire.medium = std::move(medium);
             c.wire.data_parallel_rank =
                 to_integer<std::int64_t>(data_parallel_rank, "data_parallel_rank");
             if (groups) {
               for (const AttentionSpec& g : *groups)
                 c.wire.groups.push_back(events::GroupWireSpec::from(g));
             }
             c.probe_hasher = std::move(probe_hasher);
             c.linger_ms = to_integer<int>(linger_ms, "linger_ms");
             auto p = std::make_unique<PyPublisher>();
             p->pub = std::make_unique<KVEventPublisher>(std::move(c));
             return p;
           }),
           py::arg("endpoint") = "tcp://*:5557", py::kw_only(), py::arg("bind") = py::none(),
           py::arg("replay_endpoint") = py::none(), py::arg("buffer_steps") = 10'000,
           py::arg("hwm") = 100'000, py::arg("max_queue_size") = 100'000, py::arg("topic") = "",
           py::arg("hash_format") = "int64", py::arg("encoding") = "array_like",
           py::arg("medium") = "GPU", py::arg("data_parallel_rank") = 0,
           py::arg("groups") = py::none(), py::arg("probe_hasher") = py::none(),
           py::arg("linger_ms") = 200,
           "endpoint: bound when it contains '*' or '::' or is ipc:// / inproc://, else "
           "connected (bind= overrides). hash_format: 'int64' (vLLM's default) or 'bytes'; "
           "encoding: 'array_like' or 'map'; medium: sent for events without one; groups: the "
           "AttentionSpecs describing each group; probe_hasher: answers hash-agreement probes.")
      .def(
          "publish",
          [](PyPublisher& s, py::iterable events) {
            std::vector<KVEvent> batch;
            for (py::handle e : events) batch.push_back(event_from_python(e));
            return seq_or_none(s.get().publish(std::move(batch)));
          },
          py::arg("events"),
          "Queues one batch of event objects (from take_events()); returns its sequence number, "
          "or None for an empty batch.")
      .def(
          "publish_from",
          [](PyPublisher& s, py::object manager) {
            KVEventPublisher& pub = s.get();
            std::vector<KVEvent> batch;
            if (py::isinstance<PyKVCacheManager>(manager)) {
              auto& kv = manager.cast<PyKVCacheManager&>();
              BusyGuard g(kv.busy, "KVCacheManager");
              batch = kv.kv.take_events();
            } else if (py::isinstance<PyTieredKVCacheManager>(manager)) {
              auto& t = manager.cast<PyTieredKVCacheManager&>();
              BusyGuard g(t.busy, "TieredKVCacheManager");
              batch = t.tier.take_events();
            } else {
              throw Error(ErrorCode::kInvalidArgument,
                          "publish_from: expected a KVCacheManager or TieredKVCacheManager");
            }
            return seq_or_none(pub.publish(std::move(batch)));
          },
          py::arg("manager"),
          "Takes the manager's pending events and queues them as one batch (no Python event "
          "objects are made); returns its sequence number, or None when there were none.")
      .def(
          "flush",
          [](PyPublisher& s, double timeout_s) {
            // Checked before the conversion: NaN, a negative or a huge float would be undefined
            // behaviour as an integer count of milliseconds.
            constexpr double kMaxFlushSeconds = 86'400.0;
            if (!(timeout_s >= 0.0 && timeout_s <= kMaxFlushSeconds)) {
              throw Error(ErrorCode::kInvalidArgument,
                          "KVEventPublisher.flush: timeout_s must be in [0, 86400] seconds, got " +
                              py::repr(py::float_(timeout_s)).cast<std::string>());
            }
            KVEventPublisher& pub = s.get();
            py::gil_scoped_release nogil;
            return pub.flush(std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1e3)));
          },
          py::arg("timeout_s") = 1.0,
          "Waits up to timeout_s for the queue to drain into the PUB socket; True when it did.")
      .def(
          "shutdown",
          [](PyPublisher& s) {
            if (!s.pub) return;
            py::gil_scoped_release nogil;
            s.pub->shutdown();
          },
          "Sends what is queued (up to linger_ms) and closes the sockets. Idempotent; publish "
          "afterwards raises pagedkv.Error (INVALID_STATE).")
      .def_property_readonly(
          "endpoint", [](PyPublisher& s) { return s.get().endpoint(); },
          "The bound address (e.g. the port chosen for tcp://127.0.0.1:*).")
      .def_property_readonly("replay_endpoint",
                             [](PyPublisher& s) { return s.get().replay_endpoint(); })
      .def("stats", [](PyPublisher& s) { return s.get().stats(); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyPublisher& s, py::args) {
        if (!s.pub) return;
        py::gil_scoped_release nogil;
        s.pub->shutdown();
      });
}

}  // namespace pagedkv::python
