# Per-tick main-thread cost of the GDNative PolicyRunner (tests/scripts/engine-bench.sh runs this scene): for each
# agent count, one tick_discrete(ids, observations) per frame (the tick and its actions in one call into the
# runner), timed from GDScript, median of ~0.3 s.
# Observations are (i * 7919) % 256 over the whole batch, as in the other engines' benchmarks. Prints one JSON line
# per count. Settings from the environment: POLICYPORT_POLICY, POLICYPORT_BENCH_AGENTS ("1,100,1000,10000"),
# POLICYPORT_BENCH_SECONDS (0.3). A runner built with the bench-timing feature adds two lines per count: the act
# inside the same calls (godot3_in_act) and the tick less it (godot3_in_overhead), medians over the samples.
extends Node

const Policyport = preload("res://policyport.gd")


func _ready() -> void:
	var path = OS.get_environment("POLICYPORT_POLICY")
	var counts = OS.get_environment("POLICYPORT_BENCH_AGENTS")
	var seconds = OS.get_environment("POLICYPORT_BENCH_SECONDS")
	var budget_us = int(float(seconds if seconds != "" else "0.3") * 1000000.0)
	for c in (counts if counts != "" else "1,100,1000,10000").split(","):
		var n = int(c)
		var runner = Policyport.load_runner(path, 1, true)
		if runner == null:
			print("godot3 bench: FAILED: the policy did not load")
			get_tree().quit(1)
			return
		var ids = []
		for i in n:
			ids.append(runner.spawn())
		var total = n * runner.info()["obs_len"]
		var obs = PoolRealArray()
		for i in 256:
			obs.append((i * 7919) % 256)
		while obs.size() < total:
			obs.append_array(obs)  # the pattern's period is 256: doubling keeps it
		obs.resize(total)
		# Calls per sample: a tick of few agents is shorter than the clock's microsecond.
		var reps = max(1, 2000 / max(n, 1))
		var times = []
		# A runner built with bench-timing (engine-bench.sh) also says how long its acts took: read around each
		# sample (outside its clock), they give the act inside the same calls and what the runner adds to it.
		var timed = runner.info().has("bench_act_seconds")
		var acts = []
		var overheads = []
		var start = OS.get_ticks_usec()
		if not runner.tick(ids, obs):
			print("godot3 bench: FAILED: %s" % runner.last_error())
			get_tree().quit(1)
			return
		while times.size() < 5 or (OS.get_ticks_usec() - start < budget_us and times.size() < 10000):
			var acted = runner.info()["bench_act_seconds"] if timed else 0.0
			var t0 = OS.get_ticks_usec()
			for r in reps:
				runner.tick_discrete(ids, obs)
			var tick_us = float(OS.get_ticks_usec() - t0) / reps
			times.append(tick_us)
			if timed:
				var act_us = (runner.info()["bench_act_seconds"] - acted) * 1000000.0 / reps
				acts.append(act_us)
				overheads.append(tick_us - act_us)
		times.sort()
		print('{"path": "godot3_tick", "agents": %d, "us_per_tick": %.2f}' % [n, times[times.size() / 2]])
		if timed:
			acts.sort()
			overheads.sort()
			print('{"path": "godot3_in_act", "agents": %d, "us_per_tick": %.3f}' % [n, acts[acts.size() / 2]])
			print('{"path": "godot3_in_overhead", "agents": %d, "us_per_tick": %.3f}' % [n, overheads[overheads.size() / 2]])
	get_tree().quit(0)
