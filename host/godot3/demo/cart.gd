# One CartPole (Gymnasium's CartPole-v1 dynamics) as an agent node of PolicyAgents: a fallen pole (or 500 steps)
# ends the episode, the cart resets and sets policyport_episode_start so its next step starts a new episode.
extends Node

const CartPole = preload("res://cartpole.gd")

signal finished(ret)

var policyport_episode_start = false
var s = [0.0, 0.0, 0.0, 0.0]
var ret = 0.0
var steps = 0


func _ready() -> void:
	_reset()


func _reset() -> void:
	for i in 4:
		s[i] = rand_range(-0.05, 0.05)
	ret = 0.0
	steps = 0


func policyport_observation() -> PoolRealArray:
	return PoolRealArray(s)


func policyport_apply(action: PoolIntArray) -> void:
	var fell = CartPole.step(s, action[0])
	ret += 1.0
	steps += 1
	if fell or steps >= 500:
		emit_signal("finished", ret)
		_reset()
		policyport_episode_start = true
