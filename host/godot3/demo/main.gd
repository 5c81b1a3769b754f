# host/capi/examples/agents.c as a Godot 3 scene: N CartPole agents, one PolicyRunner.tick per physics frame in a
# rotating order, a respawn when a pole falls, agent 0 despawned and replaced midway. The dynamics, the reset
# generator (a 64-bit LCG) and the order of every runner call are the C program's, so the returns printed are its
# returns, episode for episode (tests/scripts/godot3-test.sh compares them). Settings from the environment:
# POLICYPORT_POLICY (res://cartpole.policy), POLICYPORT_AGENTS (64), POLICYPORT_TICKS (1500).
extends Node

const Policyport = preload("res://policyport.gd")
const CartPole = preload("res://cartpole.gd")

var runner
var n := 64
var ticks := 1500
var t := 0
var agents := []  # each: {id, s: [x, x_dot, theta, theta_dot], ret, steps}
var returns := []
var total := 0.0
# The C example's generator state 0x9E3779B97F4A7C15 as a signed 64-bit int (GDScript ints wrap like C's).
var rng := -7046029254386353131


func _env_int(name: String, fallback: int) -> int:
	var v = OS.get_environment(name)
	return int(v) if v != "" else fallback


func _fail(what: String) -> void:
	print("godot3: FAILED: %s: %s" % [what, runner.last_error() if runner else ""])
	get_tree().quit(1)
	set_physics_process(false)


func _uniform() -> float:
	rng = rng * 6364136223846793005 + 1442695040888963407
	# The C program's `rng >> 11` on an unsigned 64-bit value: the top 53 bits.
	var top = (rng >> 11) & 0x1FFFFFFFFFFFFF
	# int / float divides in double; float(top) would round through Godot 3's 32-bit real_t first.
	return top / 9007199254740992.0


func _reset(a: Dictionary) -> void:
	for i in 4:
		a.s[i] = -0.05 + 0.1 * _uniform()
	a.ret = 0.0
	a.steps = 0


# The runner's refusals seen from GDScript: typed, `false` / -1 with a reason, and nothing changed (the
# returns that follow are still the C program's).
func _check_refusals() -> bool:
	var fresh = _new_runner()
	var id = agents[0].id
	var zeros = PoolRealArray([0, 0, 0, 0])
	return (
		_refused(fresh.load_bytes(PoolByteArray([1, 2, 3]), 0, true), fresh, "three bytes as a policy", "could not load")
		and _refused(fresh.spawn() != -1, fresh, "spawn() before load()", "load()")
		and _refused(runner.tick(PoolIntArray([0]), zeros), runner, "ids as a PoolIntArray", "64-bit")
		and _refused(runner.tick([0.5], zeros), runner, "a float id", "not an int")
		and _refused(runner.tick([id, "x"], zeros + zeros), runner, "a String as the second id", "ids[1] is String")
		and _refused(runner.tick([id, id], zeros + zeros), runner, "one id twice", "already observed")
		and _refused(runner.tick_discrete([id, id], zeros + zeros).size() > 0, runner, "tick_discrete: one id twice", "already observed")
		and _refused(runner.tick([123456789], zeros), runner, "an id never spawned", "not alive")
		and _refused(runner.tick([id], PoolRealArray([0, 0, 0])), runner, "3 observation numbers for 4", "observation")
		and _refused(runner.tick([id]), runner, "tick() without observations", "argument 2")
		and _refused(runner.tick_masked([id], zeros, PoolByteArray([1, 7])), runner, "mask byte 7", "mask byte 1 is 7")
		and _refused(runner.despawn("x"), runner, "despawn(\"x\")", "must be int")
		and _unchanged()
	)


func _unchanged() -> bool:
	var info = runner.info()
	if info["tick"] != 0 or info["alive"] != n:
		print("godot3: FAILED: the refusals changed the runner: %s" % str(info))
		return false
	return true


# True when `accepted` is false and `r.last_error()` names `want`; prints what happened.
func _refused(accepted: bool, r, what: String, want: String) -> bool:
	var err = r.last_error()
	if accepted or err.find(want) < 0:
		print("godot3: FAILED: %s: want a refusal naming '%s', got '%s'" % [what, want, err])
		return false
	print("godot3: refused as it should: %s (%s)" % [what, err])
	return true


func _new_runner():
	return Policyport.PolicyRunner.new()


func _ready() -> void:
	n = _env_int("POLICYPORT_AGENTS", 64)
	ticks = _env_int("POLICYPORT_TICKS", 1500)
	var path = OS.get_environment("POLICYPORT_POLICY")
	runner = Policyport.load_runner(path if path != "" else "res://cartpole.policy", 7, true)
	if runner == null:
		print("godot3: FAILED: the policy did not load")
		get_tree().quit(1)
		set_physics_process(false)
		return
	var info = runner.info()
	if info["obs_len"] != 4 or not info["discrete"] or info["action_len"] != 1:
		_fail("not a CartPole policy: %s" % str(info))
		return
	for i in n:
		var a = {"id": runner.spawn(), "s": [0.0, 0.0, 0.0, 0.0], "ret": 0.0, "steps": 0}
		if a.id < 0:
			_fail("spawn")
			return
		_reset(a)
		agents.append(a)
	# A stale id is a refusal, never another agent's row (as the C program checks).
	var gone = runner.spawn()
	if gone < 0 or not runner.despawn(gone) or runner.respawn(gone):
		_fail("a stale id")
		return
	if not info.get("ids_in_place", false):
		_fail("the runner reads the ids element by element through the API on this Godot (info: %s)" % str(info))
		return
	if not _check_refusals() or not _check_actions_are_kept(path if path != "" else "res://cartpole.policy"):
		get_tree().quit(1)
		set_physics_process(false)


# The array discrete_actions() answered keeps its numbers after the next tick (the runner writes the next
# answer into the same PoolIntArray, which Godot copies first while this one is held), on a runner of its own.
func _check_actions_are_kept(path: String) -> bool:
	var r = Policyport.load_runner(path, 1, false)
	var a = r.spawn()
	var b = r.spawn()
	var right = [0.0, 0.0, 0.15, 1.0]
	var left = [0.0, 0.0, -0.15, -1.0]
	if not r.tick([a, b], PoolRealArray(right + left)):
		return _failed("tick: %s" % r.last_error())
	var first = r.discrete_actions()
	if not r.tick([a, b], PoolRealArray(left + right)):
		return _failed("tick: %s" % r.last_error())
	var second = r.discrete_actions()
	if first[0] == first[1] or first[0] != second[1] or first[1] != second[0]:
		return _failed("the first tick's actions %s changed with the second's %s" % [str(first), str(second)])
	print("godot3: the last actions are kept while the next are written: %s then %s" % [str(first), str(second)])
	return true


func _failed(what: String) -> bool:
	print("godot3: FAILED: %s" % what)
	return false


func _physics_process(_delta: float) -> void:
	if t == ticks:
		return
	if t == ticks / 2:
		# Agent 0 leaves; a new agent takes its place (and its freed env id, with a new episode).
		if not runner.despawn(agents[0].id):
			_fail("despawn")
			return
		agents[0].id = runner.spawn()
		_reset(agents[0])
	var order := []
	var ids := []
	var obs := PoolRealArray()
	for k in n:
		order.append((k + t * 7) % n)  # the engine's order this frame
	for k in order:
		var a = agents[k]
		ids.append(a.id)
		for i in 4:
			obs.append(a.s[i])
	# Odd frames the one-call form (tick and discrete_actions together), even frames the two calls: the same
	# actions either way, so the returns stay the C program's.
	var actions
	if t % 2 == 1:
		actions = runner.tick_discrete(ids, obs)
		if actions.size() != n:
			_fail("tick_discrete")
			return
	else:
		if not runner.tick(ids, obs):
			_fail("tick")
			return
		actions = runner.discrete_actions()
	for j in n:
		var a = agents[order[j]]
		a.ret += 1.0
		a.steps += 1
		if CartPole.step(a.s, actions[j]) or a.steps >= 500:
			returns.append(a.ret)
			total += a.ret
			if not runner.respawn(a.id):
				_fail("respawn")
				return
			_reset(a)
	t += 1
	if t == ticks:
		var line = "returns:"
		for r in returns:
			line += " %d" % int(r)
		print(line)
		var mean = total / returns.size() if returns.size() > 0 else 0.0
		print("godot3: %d agents, %d ticks, %d episodes finished, mean return %.2f" % [n, ticks, returns.size(), mean])
		get_tree().quit(0 if returns.size() > 0 else 1)
