"""Ember's Python client: submit, follow and cancel jobs on an emberd over its gRPC API.

    import ember
    c = ember.Client("127.0.0.1:29400", token_file="/etc/ember/token")
    job = c.submit("examples/tiny-gpt.yaml")      # a path, YAML text or a dict
    for line in c.logs(job.id, follow=True):
        print(line.rank, line.line)
    print(c.wait(job.id, timeout=600).state_name)

Errors raise ember.EmberError, whose .code is the gRPC status code name ("UNAUTHENTICATED",
"NOT_FOUND", ...) and whose .exit_code is the one emberctl uses for it. A Client holds one gRPC
channel and may be shared by threads. `python3 -m ember --help` is the command line.
"""

from ember.client import Client, EmberError, Job, JOB_STATES, TERMINAL_STATES  # noqa: F401

__all__ = ["Client", "EmberError", "Job", "JOB_STATES", "TERMINAL_STATES"]
