"""ember.Client and `python3 -m ember` against the real emberd started by python_client_test.sh
(test_worker ranks: a job named *hang* sleeps until cancelled, others run `steps` steps)."""
import json
import os
import subprocess
import sys
import time
import unittest

import ember

ADDR = os.environ["EMBER_ADDRESS"]
TOKEN = os.environ["EMBER_TOKEN_FILE"]
T = os.environ["TEST_DIR"]
MODEL = {"n_layers": 1, "d_model": 32, "n_heads": 2, "context_length": 16}


def spec(name, steps=5):
    return {"name": name, "model": MODEL, "steps": steps,
            "parallelism": {"strategy": "fsdp", "world_size": 2}}


def cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-P", "-m", "ember", *args], capture_output=True,
                          timeout=timeout, text=True)


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = ember.Client(ADDR, token_file=TOKEN)

    def test_1_auth(self):
        bad = os.path.join(T, "bad-token")
        with open(bad, "w") as f:
            f.write("wrong-token-wrong-token-wrong\n")
        with self.assertRaises(ember.EmberError) as cm:
            ember.Client(ADDR, token_file=bad).list()
        self.assertEqual(cm.exception.code, "UNAUTHENTICATED")
        self.assertEqual(cm.exception.exit_code, 4)
        with self.assertRaises(ember.EmberError) as cm:
            ember.Client(ADDR).nodes()  # no token at all
        self.assertEqual(cm.exception.code, "UNAUTHENTICATED")
        nodes = self.c.nodes()
        self.assertEqual([n.name for n in nodes], ["py"])
        self.assertEqual(sorted(d.id for d in nodes[0].devices), ["cpu:0", "cpu:1"])

    def test_2_submit_follow_wait(self):
        job = self.c.submit(spec("py-ok", steps=6), submission_id="py-ok-1")
        self.assertTrue(job.id)
        again = self.c.submit(spec("py-ok", steps=6), submission_id="py-ok-1")
        self.assertEqual(again.id, job.id, "same submission id, same job")
        ranks = set()
        for line in self.c.logs(job.id, follow=True):
            ranks.add(line.rank)
        self.assertEqual(ranks, {0, 1}, "follow streams both ranks' lines until the end")
        done = self.c.wait(job.id, timeout=60)
        self.assertEqual(done.state_name, "SUCCEEDED", done)
        self.assertEqual(done.world_size, 2)
        self.assertEqual(self.c.status(job.id).proto.progress.metrics.step, 6)
        self.assertIn(job.id, [j.id for j in self.c.list()])

    def test_3_invalid_spec_names_the_field(self):
        with self.assertRaises(ember.EmberError) as cm:
            self.c.submit({"name": "py-bad", "steps": -1})
        self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
        self.assertIn("steps", cm.exception.message)
        with self.assertRaises(ember.EmberError) as cm:
            self.c.status("no-such-job")
        self.assertEqual(cm.exception.exit_code, 5)

    def test_4_cancel(self):
        job = self.c.submit(spec("py-hang"))
        deadline = time.monotonic() + 30
        while self.c.status(job.id).state_name != "RUNNING":
            self.assertLess(time.monotonic(), deadline, "job never started running")
            time.sleep(0.2)
        with self.assertRaises(ember.EmberError) as cm:
            self.c.wait(job.id, timeout=1)
        self.assertEqual(cm.exception.code, "DEADLINE_EXCEEDED")
        self.c.cancel(job.id)
        self.assertEqual(self.c.wait(job.id, timeout=30).state_name, "CANCELLED")

    def test_5_cli(self):
        path = os.path.join(T, "cli-ok.yaml")
        with open(path, "w") as f:
            f.write("name: py-cli\nmodel: {n_layers: 1, d_model: 32, n_heads: 2, "
                    "context_length: 16}\nparallelism: {strategy: fsdp, world_size: 2}\nsteps: 3\n")
        r = cli("--output", "json", "submit", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        jid = json.loads(r.stdout)["id"]
        r = cli("wait", jid, "--timeout", "60", timeout=90)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCEEDED", r.stdout)
        r = cli("status", "no-such-job")
        self.assertEqual(r.returncode, 5, r.stderr)
        r = cli("--token-file", os.path.join(T, "bad-token"), "list")
        self.assertEqual(r.returncode, 4, r.stderr)
        r = cli("logs", jid, "--rank", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.strip())
        self.assertTrue(all(l.startswith("[rank 1]") for l in r.stdout.splitlines()), r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
