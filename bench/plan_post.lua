-- wrk script: POST /v1/plan with B kv_lens per request (env KVSPLIT_BENCH_B, default 256).
-- KVSPLIT_BENCH_BODIES different bodies (seeded, default 400), one picked at random per request, so no
-- server-side cache could answer from one body.
-- Lengths: a mix of short and long requests (1..32768 tokens, log-uniform), Qwen3-30B-A3B shape.
local B = tonumber(os.getenv("KVSPLIT_BENCH_B") or "256")
local NBODIES = tonumber(os.getenv("KVSPLIT_BENCH_BODIES") or "400")
local bodies = {}
math.randomseed(12345)
for i = 1, NBODIES do
  local lens = {}
  for j = 1, B do
    lens[j] = math.floor(2 ^ (math.random() * 15))
  end
  bodies[i] = '{"gpu":"NVIDIA H200","num_qo_heads":32,"num_kv_heads":4,"head_dim":128,' ..
              '"dtype":"bfloat16","page_size":16,"kv_lens":[' .. table.concat(lens, ",") .. ']}'
end
local counter = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

request = function()
  counter = counter + 1
  return wrk.format(nil, "/v1/plan", nil, bodies[math.random(NBODIES)])
end

done = function(summary, latency, requests)
  local non2xx = (summary.errors.status or 0)
  io.write(string.format(
    "RESULT requests=%d duration_s=%.3f rps=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f non2xx=%d sockerr=%d\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, non2xx,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
