// Test helper: two agents ("a", rank 0 and "b", rank 1) in one process, each with its own UCX
// worker as in two processes, rendezvousing through an in-process store server on loopback and
// connected to each other. Create() fails with the first error. Not thread-safe; test-only.
#ifndef EMBER_RUNTIME_ONESIDED_AGENT_PAIR_H_
#define EMBER_RUNTIME_ONESIDED_AGENT_PAIR_H_

#include <memory>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "runtime/base/status_macros.h"
#include "runtime/onesided/agent.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"

namespace ember::onesided::testing {

struct AgentPair {
  std::unique_ptr<store::StoreServer> server;
  std::optional<store::Client> client;
  std::unique_ptr<Agent> a, b;
  Connection* a_to_b = nullptr;  // owned by a
  Connection* b_to_a = nullptr;  // owned by b

  // `base`: options for both agents (store, name and rank are set here).
  static absl::StatusOr<std::unique_ptr<AgentPair>> Create(AgentOptions base = {}) {
    auto p = std::make_unique<AgentPair>();
    ASSIGN_OR_RETURN(p->server, store::StoreServer::Start({.address = "127.0.0.1:0"}));
    ASSIGN_OR_RETURN(store::Client c, store::Client::Connect({.address = p->server->address()}));
    p->client.emplace(std::move(c));
    base.store = &*p->client;
    base.name = "a";
    base.rank = 0;
    ASSIGN_OR_RETURN(p->a, Agent::Create(base));
    base.name = "b";
    base.rank = 1;
    ASSIGN_OR_RETURN(p->b, Agent::Create(base));
    absl::StatusOr<Connection*> ca;
    std::thread t([&] { ca = p->a->Connect("b"); });
    absl::StatusOr<Connection*> cb = p->b->Connect("a");
    t.join();
    RETURN_IF_ERROR(ca.status());
    RETURN_IF_ERROR(cb.status());
    p->a_to_b = *ca;
    p->b_to_a = *cb;
    return p;
  }
};

}  // namespace ember::onesided::testing

#endif  // EMBER_RUNTIME_ONESIDED_AGENT_PAIR_H_
