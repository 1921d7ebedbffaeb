"""The Python client without a daemon: spec loading and uploads, error mapping, the stubs."""
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import ember
from ember import spec_files
from ember._gen.proto import jobs_pb2


class SpecTest(unittest.TestCase):
    def test_file_uploads_relative_files_beside_it(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "corpus.txt"), "wb") as f:
                f.write(b"hello world\n")
            with open(os.path.join(d, "job.yaml"), "w") as f:
                f.write("name: t\ndata:\n  text_path: corpus.txt\nsteps: 3\n")
            text, files = spec_files.load_spec(os.path.join(d, "job.yaml"), nproc=3)
            self.assertEqual(files, {"corpus.txt": b"hello world\n"})
            self.assertIn("world_size: 3", text)
            self.assertIn("text_path: corpus.txt", text)

    def test_absolute_parent_and_missing_files_are_not_uploaded(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "job.yaml"), "w") as f:
                f.write("name: t\ndata:\n  path: ../secret\n  text_path: /etc/passwd\n")
            _, files = spec_files.load_spec(os.path.join(d, "job.yaml"))
            self.assertEqual(files, {})

    def test_text_and_dict(self):
        text, files = spec_files.load_spec({"name": "d", "steps": 2}, nproc=2)
        self.assertEqual(files, {})
        self.assertIn("world_size: 2", text)
        text, _ = spec_files.load_spec("name: x\nsteps: 4\n")
        self.assertIn("steps: 4", text)

    def test_malformed(self):
        with self.assertRaises(ValueError):
            spec_files.load_spec("name: [unclosed\n")
        with self.assertRaises(ValueError):
            spec_files.load_spec("- a list\n- not a spec\n")


class ErrorTest(unittest.TestCase):
    def test_exit_codes_match_emberctl(self):
        for code, want in (("INVALID_ARGUMENT", 2), ("FAILED_PRECONDITION", 2),
                           ("UNAVAILABLE", 3), ("DEADLINE_EXCEEDED", 3),
                           ("UNAUTHENTICATED", 4), ("NOT_FOUND", 5), ("INTERNAL", 7)):
            self.assertEqual(ember.EmberError(code, "m").exit_code, want)

    def test_states_come_from_the_proto(self):
        self.assertEqual(ember.JOB_STATES[jobs_pb2.SUCCEEDED], "SUCCEEDED")
        self.assertEqual(ember.Job(jobs_pb2.Job(id="j", state=jobs_pb2.FAILED)).state_name,
                         "FAILED")
        self.assertTrue(ember.Job(jobs_pb2.Job(state=jobs_pb2.CANCELLED)).done)
        self.assertFalse(ember.Job(jobs_pb2.Job(state=jobs_pb2.RUNNING)).done)

    def test_unreachable_daemon(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        t0 = time.monotonic()
        with self.assertRaises(ember.EmberError) as cm:
            ember.Client("127.0.0.1:%d" % port, connect_timeout=1.0)
        self.assertEqual(cm.exception.code, "UNAVAILABLE")
        self.assertIn("127.0.0.1:%d" % port, cm.exception.message)
        self.assertLess(time.monotonic() - t0, 5)

    def test_missing_token_file(self):
        with self.assertRaises(ember.EmberError) as cm:
            ember.Client("127.0.0.1:1", token_file="/nonexistent/token")
        self.assertEqual(cm.exception.exit_code, 4)
        self.assertIn("/nonexistent/token", cm.exception.message)

    def test_cli_usage_and_unreachable_exit_codes(self):
        env = dict(os.environ, EMBER_ADDRESS="127.0.0.1:1")
        r = subprocess.run([sys.executable, "-P", "-m", "ember", "bogus"], env=env,
                           capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        r = subprocess.run([sys.executable, "-P", "-m", "ember", "--output", "json", "list"], env=env,
                           capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn(b'"UNAVAILABLE"', r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
