"""ember.Client: the job API (proto/jobs.proto) over gRPC, as emberctl's C++ client speaks it.

Authentication is the cluster token sent as `authorization: Bearer <token>` on every call; TLS
(with a CA, and a client certificate for mTLS) when the daemon serves it. Every failure raises
EmberError naming what failed and what to do; nothing is retried behind the caller's back except
Wait's polling. Thread-safe: one channel, stubs are stateless.
"""
import os
import time

import grpc

from ember._gen.proto import jobs_pb2, jobs_pb2_grpc
from ember.spec_files import load_spec

JOB_STATES = {v.number: v.name for v in jobs_pb2.JobState.DESCRIPTOR.values}
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")

# Exit codes shared with emberctl (launcher/cli.h).
_EXIT_FOR_CODE = {
    "INVALID_ARGUMENT": 2, "PERMISSION_DENIED": 2, "FAILED_PRECONDITION": 2,
    "UNAVAILABLE": 3, "DEADLINE_EXCEEDED": 3, "UNAUTHENTICATED": 4, "NOT_FOUND": 5,
}


class EmberError(Exception):
    """A failed call. `code`: gRPC status name; `exit_code`: emberctl's exit code for it."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.exit_code = _EXIT_FOR_CODE.get(code, 7)


class Job:
    """A jobs.v1.Job with its state as a name; other fields read through (job.proto has all)."""

    def __init__(self, proto):
        self.proto = proto

    @property
    def state_name(self):
        return JOB_STATES.get(self.proto.state, str(self.proto.state))

    @property
    def done(self):
        return self.state_name in TERMINAL_STATES

    def __getattr__(self, name):
        return getattr(self.proto, name)

    def __repr__(self):
        return "Job(id=%r, name=%r, state=%s, reason=%r)" % (
            self.proto.id, self.proto.name, self.state_name, self.proto.reason)


def _read(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise EmberError("UNAUTHENTICATED" if what == "token file" else "INVALID_ARGUMENT",
                         "cannot read %s %s: %s" % (what, path, e.strerror)) from None


class Client:
    """Connects to emberd at `address` ("host:port").

    token / token_file: the cluster token (token_file wins when both are given; whitespace around
    it is dropped). tls_ca (+ tls_cert, tls_key for mTLS): talk TLS. Waits up to
    connect_timeout seconds for the channel, raising EmberError("UNAVAILABLE") otherwise.
    """

    def __init__(self, address="127.0.0.1:29400", token=None, token_file=None, tls_ca=None,
                 tls_cert=None, tls_key=None, connect_timeout=5.0, call_timeout=30.0):
        if token_file:
            token = _read(token_file, "token file").decode("utf-8", "replace").strip()
            if not token:
                raise EmberError("UNAUTHENTICATED", "token file %s is empty" % token_file)
        self.address = address
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self._call_timeout = call_timeout
        options = [("grpc.max_receive_message_length", 64 << 20)]
        if tls_ca:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca, "TLS CA file"),
                private_key=_read(tls_key, "TLS key file") if tls_key else None,
                certificate_chain=_read(tls_cert, "TLS certificate file") if tls_cert else None)
            self._channel = grpc.secure_channel(address, creds, options)
        else:
            self._channel = grpc.insecure_channel(address, options)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise EmberError("UNAVAILABLE",
                             "cannot reach emberd at %s within %.0f s; is it running, and is the "
                             "address right (--address / $EMBER_ADDRESS)?" %
                             (address, connect_timeout)) from None
        self._jobs = jobs_pb2_grpc.JobsStub(self._channel)
        self._nodes = jobs_pb2_grpc.NodesStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- unary calls -------------------------------------------------------------------------
    def _call(self, method, request, timeout=None):
        try:
            return method(request, timeout=timeout or self._call_timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _error(self, e):
        code = e.code().name if e.code() is not None else "UNKNOWN"
        details = e.details() or ""
        if code == "UNAUTHENTICATED":
            details += " (check the token: --token-file / $EMBER_TOKEN_FILE)"
        elif code == "UNAVAILABLE":
            details = "emberd at %s: %s" % (self.address, details)
        return EmberError(code, details)

    def submit(self, spec, files=None, submission_id="", nproc=0):
        """Submits a job: `spec` is a spec file path, YAML text or a dict. Relative files it names
        beside a spec file are uploaded; `files` adds more {relative name: bytes}. Returns Job.
        A second submit with the same submission_id returns the first job."""
        try:
            text, found = load_spec(spec, nproc)
        except (ValueError, OSError) as e:
            raise EmberError("INVALID_ARGUMENT", str(e)) from None
        found.update(files or {})
        req = jobs_pb2.SubmitRequest(submission_id=submission_id or "", spec_yaml=text)
        for name, data in found.items():
            req.files[name] = data if isinstance(data, bytes) else data.encode("utf-8")
        return Job(self._call(self._jobs.Submit, req).job)

    def status(self, job_id):
        return Job(self._call(self._jobs.Get, jobs_pb2.GetJobRequest(id=job_id)))

    def list(self, active_only=False, limit=0):
        r = self._call(self._jobs.List, jobs_pb2.ListJobsRequest(active_only=active_only,
                                                                  limit=limit))
        return [Job(j) for j in r.jobs]

    def cancel(self, job_id):
        return Job(self._call(self._jobs.Cancel, jobs_pb2.CancelJobRequest(id=job_id)))

    def nodes(self):
        return list(self._call(self._nodes.List, jobs_pb2.ListNodesRequest()).nodes)

    def dump(self, job_id):
        """Asks every rank of a running job to dump its flight recorder; returns DumpResponse."""
        return self._call(self._jobs.DumpFlightRecorder, jobs_pb2.DumpRequest(id=job_id))

    # --- streams and waiting ------------------------------------------------------------------
    def logs(self, job_id, rank=-1, follow=False, tail=0, attempt=-1):
        """Yields jobs.v1.LogLine (rank, line, attempt); with follow, until the job ends."""
        return self._stream(self._jobs.StreamLogs, jobs_pb2.StreamLogsRequest(
            id=job_id, rank=rank, follow=follow, tail_lines=tail, attempt=attempt), follow)

    def metrics(self, job_id, follow=False, interval_ms=0):
        """Yields jobs.v1.MetricsUpdate (state, attempt, per-rank Progress)."""
        return self._stream(self._jobs.StreamMetrics, jobs_pb2.StreamMetricsRequest(
            id=job_id, follow=follow, interval_ms=interval_ms), follow)

    def _stream(self, method, request, follow):
        stream = method(request, metadata=self._metadata,
                        timeout=None if follow else self._call_timeout)
        try:
            for item in stream:
                yield item
        except grpc.RpcError as e:
            raise self._error(e) from None
        finally:
            stream.cancel()

    def wait(self, job_id, timeout=None, poll_s=0.5):
        """Polls until the job is SUCCEEDED, FAILED or CANCELLED and returns it; raises
        EmberError("DEADLINE_EXCEEDED") after `timeout` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.status(job_id)
            if job.done:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise EmberError("DEADLINE_EXCEEDED",
                                 "job %s is still %s after %.0f s" % (job_id, job.state_name,
                                                                      timeout))
            time.sleep(poll_s if deadline is None
                       else max(0.0, min(poll_s, deadline - time.monotonic())))


def default_token_file():
    """$EMBER_TOKEN_FILE, else /etc/ember/token when readable, else None (as emberctl)."""
    env = os.environ.get("EMBER_TOKEN_FILE")
    if env:
        return env
    return "/etc/ember/token" if os.access("/etc/ember/token", os.R_OK) else None
