# PolicyAgents for Godot 3: each physics frame the nodes of `group` are the agents. It calls each node's
# policyport_observation() (a PoolRealArray), acts once for all of them through one PolicyRunner, and calls each
# node's policyport_apply(action) (a PoolIntArray for discrete policies, a PoolRealArray for continuous ones). A
# node that joins the group is a new agent (a new episode); one that leaves it, or is freed, releases its id; a
# node whose `policyport_episode_start` is true starts a new episode (the flag is cleared). Add it as a child of
# the scene with `policy_path` set; `runner` exposes info() and last_error().
extends Node

export(String, FILE) var policy_path = ""
export var group = "policyport_agents"
export var rng_seed = 0
export var sample = true
var runner = null
var _action_len = 0
var _ids = {}  # node instance id -> agent id


func _ready() -> void:
	runner = preload("res://policyport.gd").load_runner(policy_path, rng_seed, sample)
	if runner != null:
		_action_len = runner.info()["action_len"]


func _physics_process(_delta: float) -> void:
	if runner == null:
		return
	var present = {}
	var ids = []
	var obs = PoolRealArray()
	var order = []
	for node in get_tree().get_nodes_in_group(group):
		var key = node.get_instance_id()
		present[key] = true
		if not _ids.has(key):
			var fresh = runner.spawn()
			if fresh < 0:
				push_error("policyport: %s" % runner.last_error())
				continue
			_ids[key] = fresh
		var id = _ids[key]
		if node.get("policyport_episode_start"):
			runner.respawn(id)
			node.set("policyport_episode_start", false)
		obs.append_array(node.policyport_observation())
		ids.append(id)
		order.append(node)
	# Nodes that left the group or were freed release their ids.
	for key in _ids.keys():
		if not present.has(key):
			runner.despawn(_ids[key])
			_ids.erase(key)
	if order.empty():
		return
	if not runner.tick(ids, obs):
		push_error("policyport: %s" % runner.last_error())
		return
	var discrete = runner.discrete_actions()
	var actions = discrete if discrete.size() > 0 else runner.continuous_actions()
	var k = _action_len
	for i in order.size():
		# Godot 3.2's pool arrays have no subarray(): one action row copied out.
		var row = PoolIntArray() if discrete.size() > 0 else PoolRealArray()
		for j in k:
			row.append(actions[i * k + j])
		order[i].policyport_apply(row)
