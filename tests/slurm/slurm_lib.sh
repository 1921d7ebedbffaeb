# Helpers of the Slurm tests (source after slurm_cluster.sh).

# spec NAME WORLD STEPS: a tiny GPT (examples/tiny-gpt.yaml scaled down) on CPU ranks.
slurm_spec() {
  printf 'name: %s\nmodel: {vocab_size: 256, context_length: 32, n_layers: 1, n_heads: 2, d_model: 32, mlp: swiglu}\ndata: {text_path: tiny_corpus.txt}\noptimizer: {name: adamw, lr: 0.003, schedule: cosine, warmup_steps: 2, grad_clip: 1.0}\nparallelism: {strategy: fsdp, world_size: %s}\nprecision: {param_dtype: bf16, reduce_dtype: f32}\ncheckpoint: {dir: checkpoints, every_steps: %s, keep_last: 2}\nresources: {device_type: cpu}\nsteps: %s\nbatch_size: 4\nthreads: 1\nseed: 1\nlog_every: 1\n' "$1" "$2" "${4:-1000}" "$3"
}

# wait_slurm_job ID SECONDS: waits until the job left the queue (or is in a final state);
# prints its state.
wait_slurm_job() {
  local id="$1" end=$((SECONDS + $2)) st
  while [ $SECONDS -lt $end ]; do
    st=$(scontrol show job "$id" -o 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
    case "$st" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE)
      echo "$st"; return 0 ;; esac
    sleep 0.2
  done
  echo "TIMEOUT_WAITING($st)"
  return 1
}

# slurm_exit_code ID: "N:S" as scontrol shows ExitCode.
slurm_exit_code() { scontrol show job "$1" -o | grep -o ' ExitCode=[0-9:]*' | cut -d= -f2; }

# losses FILE: "step loss" per line from a metrics jsonl file.
# (the step is a number or, as int64 in proto JSON, a quoted one)
losses() { sed -n 's/^{"step":"\{0,1\}\([0-9]*\)"\{0,1\},"loss":\([^,]*\),.*/\1 \2/p' "$1"; }

# pids of live processes whose environment has VAR=VALUE ($1 = "VAR=VALUE")
env_pids() { grep -lxzF "$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | grep -vx "$$"; }

# pids of live processes whose command line contains the path $1; one grep, so that a polling
# loop stays fast on a loaded machine. The pattern is written so that grep's own command line does
# not match it ("/x/[j]obs" matches "/x/jobs").
cmd_pids() {
  local b; b=$(basename "$1")
  grep -laE -- "$(dirname "$1")/[${b:0:1}]${b:1}" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3 | grep -vx "$$"
  true
}
