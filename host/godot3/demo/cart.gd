# One CartPole (Gymnasium's CartPole-v1 dynamics) as an agent node of PolicyAgents: a fallen pole (or 500 steps)
# ends the episode, the cart resets and sets policyport_episode_start so its next step starts a new episode.
extends Node

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
	var force = 10.0 if action[0] == 1 else -10.0
	var costheta = cos(s[2])
	var sintheta = sin(s[2])
	var temp = (force + 0.05 * s[3] * s[3] * sintheta) / 1.1
	var thetaacc = (9.8 * sintheta - costheta * temp) / (0.5 * (4.0 / 3.0 - 0.1 * costheta * costheta / 1.1))
	var xacc = temp - 0.05 * thetaacc * costheta / 1.1
	s[0] += 0.02 * s[1]
	s[1] += 0.02 * xacc
	s[2] += 0.02 * s[3]
	s[3] += 0.02 * thetaacc
	ret += 1.0
	steps += 1
	if abs(s[0]) > 2.4 or abs(s[2]) > 0.2094395102393195 or steps >= 500:
		emit_signal("finished", ret)
		_reset()
		policyport_episode_start = true
