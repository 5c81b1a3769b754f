//! policyport in Godot 4 (a GDExtension; `policyport.gdextension` next to the library declares it).
//!
//! - [`PolicyRunner`] (a `RefCounted`): load a `.policy` through Godot's `FileAccess` (so `res://` paths work in
//!   exported games), spawn / despawn / respawn agents by integer id, and act for all of them in one call per
//!   frame on `PackedFloat32Array`s (`tick(ids, observations)`, then `discrete_actions()` /
//!   `continuous_actions()` / `values()` in the ids' order). Errors are `false` / `-1` returns with
//!   `last_error()` saying why (a GDScript caller has no exceptions); nothing panics into the engine.
//! - [`PolicyAgents`] (a `Node`): each physics frame gathers the nodes of its group, calls their
//!   `policyport_observation()` (a `PackedFloat32Array`), acts once for all of them, and calls their
//!   `policyport_apply(action)`; a node that joins the group is a new agent (a new episode), one that leaves or is
//!   freed releases its id, and a node whose `policyport_episode_start` property is true starts a new episode.
//!
//! The agents layer underneath (`policyport-agents`) is what the C ABI, the C# binding and the Bevy plugin use;
//! its semantics (stable ids, a reused env id starts a new episode, the frame as the sampling step) are tested
//! there. CI builds this library and checks its entry symbol; no Godot 4 binary can be installed on CI's
//! machines, so `tests/scripts/godot-demo.sh` runs the demo project only where `GODOT4_BIN` is set.

use std::collections::HashMap;

use godot::classes::{FileAccess, INode, Node};
use godot::prelude::*;
use policyport_agents::ScriptRunner;

struct PolicyportExtension;

// SAFETY: the trait's contract is on what Rust cannot check: the engine side (GDScript, other extensions) must use
// the classes through Godot's object model. This library adds nothing that weakens it: it registers only its own
// two classes (`PolicyRunner`, `PolicyAgents`, reached through their `#[func]` methods), depends on no other
// GDExtension crate, keeps godot-rust's default safeguard levels (no `safeguards-release-disengaged`), and holds
// no raw engine pointers of its own.
#[gdextension]
unsafe impl ExtensionLibrary for PolicyportExtension {}

/// One policy's agents, for GDScript: a shell over [`ScriptRunner`] (which the Godot 3 runner shares).
#[derive(GodotClass)]
#[class(base = RefCounted, init)]
pub struct PolicyRunner {
    runner: ScriptRunner,
    base: Base<RefCounted>,
}

#[godot_api]
impl PolicyRunner {
    /// Load a `.policy` file (any Godot path, `res://` included) on the native cpu backend. `seed`: the sampling
    /// seed; `sample`: false for deterministic actions.
    #[func]
    fn load(&mut self, path: GString, seed: i64, sample: bool) -> bool {
        let bytes = FileAccess::get_file_as_bytes(&path);
        if bytes.is_empty() {
            return self
                .runner
                .fail(policyport_agents::ScriptError::Argument(format!(
                    "could not read {path} (missing, empty or not readable)"
                )));
        }
        self.load_bytes(bytes, seed, sample)
    }

    /// Load an artifact from bytes.
    #[func]
    fn load_bytes(&mut self, bytes: PackedByteArray, seed: i64, sample: bool) -> bool {
        self.runner.load_bytes(bytes.as_slice(), seed, sample)
    }

    /// Why the last call returned false or -1.
    #[func]
    fn last_error(&self) -> GString {
        GString::from(self.runner.last_error().as_str())
    }

    /// A new agent's id (its first tick starts a new episode), or -1.
    #[func]
    fn spawn(&mut self) -> i64 {
        self.runner.spawn()
    }

    /// The agent is gone (its id is dead from now on).
    #[func]
    fn despawn(&mut self, id: i64) -> bool {
        self.runner.despawn(id)
    }

    /// The agent starts a new episode at its next tick.
    #[func]
    fn respawn(&mut self, id: i64) -> bool {
        self.runner.respawn(id)
    }

    /// One act for the agents `ids`, row `i` of `observations` (`obs_len` floats each) for `ids[i]`. The outputs
    /// are then in `discrete_actions()` / `continuous_actions()` / `values()`, in the same order. False (and
    /// nothing changed) if the policy refused.
    #[func]
    fn tick(&mut self, ids: PackedInt64Array, observations: PackedFloat32Array) -> bool {
        self.runner.tick(
            ids.as_slice().iter().copied(),
            observations.as_slice(),
            None,
        )
    }

    /// [`PolicyRunner::tick`] with action masks: one byte per logit per id, 1 allowed, 0 forbidden.
    #[func]
    fn tick_masked(
        &mut self,
        ids: PackedInt64Array,
        observations: PackedFloat32Array,
        masks: PackedByteArray,
    ) -> bool {
        self.runner.tick(
            ids.as_slice().iter().copied(),
            observations.as_slice(),
            Some(masks.as_slice()),
        )
    }

    /// [`PolicyRunner::tick`] and [`PolicyRunner::discrete_actions`] in one call (one call from GDScript into the
    /// runner a frame, not two); refused, an empty array (`last_error()` says why).
    #[func]
    fn tick_discrete(
        &mut self,
        ids: PackedInt64Array,
        observations: PackedFloat32Array,
    ) -> PackedInt64Array {
        match self.tick(ids, observations) {
            true => self.discrete_actions(),
            false => PackedInt64Array::new(),
        }
    }

    /// The last tick's discrete actions (`ids × action_len`).
    #[func]
    fn discrete_actions(&self) -> PackedInt64Array {
        PackedInt64Array::from(self.runner.outputs().discrete.as_slice())
    }

    /// The last tick's continuous actions (`ids × action_len`).
    #[func]
    fn continuous_actions(&self) -> PackedFloat32Array {
        PackedFloat32Array::from(self.runner.outputs().continuous.as_slice())
    }

    /// Compute value estimates from the next tick on (off by default: a game acts, and a policy's separate critic
    /// is then not run at all).
    #[func]
    fn set_values(&mut self, on: bool) {
        self.runner.set_values(on);
    }

    /// The last tick's value estimates (one per id; empty without a value head, or with values off: see
    /// `set_values`).
    #[func]
    fn values(&self) -> PackedFloat32Array {
        PackedFloat32Array::from(self.runner.outputs().value.as_slice())
    }

    /// obs_len, action_len, mask_len, discrete, alive, tick, backend.
    #[func]
    fn info(&self) -> VarDictionary {
        let mut d = VarDictionary::new();
        if let Some(a) = self.runner.agents() {
            d.set("obs_len", a.obs_len() as i64);
            d.set("action_len", a.action_len() as i64);
            d.set("mask_len", a.mask_len() as i64);
            d.set("discrete", a.is_discrete());
            d.set("alive", a.len() as i64);
            d.set("tick", a.tick() as i64);
            d.set("backend", &GString::from(a.backend().as_str()));
        }
        d
    }
}

/// Drives the nodes of a group through one policy, one batched act per physics frame.
#[derive(GodotClass)]
#[class(base = Node, init)]
pub struct PolicyAgents {
    /// The `.policy` file (`res://...`).
    #[export]
    policy_path: GString,
    /// The group whose nodes are the agents.
    #[export]
    #[init(val = StringName::from("policyport_agents"))]
    group: StringName,
    #[export]
    seed: i64,
    #[export]
    #[init(val = true)]
    sample: bool,
    runner: Option<Gd<PolicyRunner>>,
    /// Agent ids by node instance id.
    ids: HashMap<i64, i64>,
    base: Base<Node>,
}

#[godot_api]
impl PolicyAgents {
    /// The runner (for `info()`, `last_error()`), once ready.
    #[func]
    fn runner(&self) -> Option<Gd<PolicyRunner>> {
        self.runner.clone()
    }
}

#[godot_api]
impl INode for PolicyAgents {
    fn ready(&mut self) {
        let mut r = PolicyRunner::new_gd();
        let ok = r
            .bind_mut()
            .load(self.policy_path.clone(), self.seed, self.sample);
        if !ok {
            godot_error!("policyport: {}", r.bind().last_error());
            return;
        }
        self.runner = Some(r);
    }

    fn physics_process(&mut self, _delta: f64) {
        let Some(mut runner) = self.runner.clone() else {
            return;
        };
        let tree = self.base().get_tree();
        let nodes = tree.get_nodes_in_group(&self.group);
        let mut present: HashMap<i64, ()> = HashMap::new();
        let mut ids = PackedInt64Array::new();
        let mut obs = PackedFloat32Array::new();
        let mut order: Vec<Gd<Node>> = vec![];
        for mut node in nodes.iter_shared() {
            let key = node.instance_id().to_i64();
            present.insert(key, ());
            let id = match self.ids.get(&key) {
                Some(id) => *id,
                None => {
                    let id = runner.bind_mut().spawn();
                    if id < 0 {
                        godot_error!("policyport: {}", runner.bind().last_error());
                        continue;
                    }
                    self.ids.insert(key, id);
                    id
                }
            };
            if node
                .get("policyport_episode_start")
                .try_to::<bool>()
                .unwrap_or(false)
            {
                runner.bind_mut().respawn(id);
                node.set("policyport_episode_start", &false.to_variant());
            }
            match node
                .call("policyport_observation", &[])
                .try_to::<PackedFloat32Array>()
            {
                Ok(o) => obs.extend_array(&o),
                Err(_) => {
                    godot_error!(
                        "policyport: {} has no policyport_observation() returning a PackedFloat32Array",
                        node.get_name()
                    );
                    return;
                }
            }
            ids.push(id);
            order.push(node);
        }
        // Nodes that left the group or were freed release their ids.
        let gone: Vec<i64> = self
            .ids
            .keys()
            .filter(|k| !present.contains_key(k))
            .copied()
            .collect();
        for k in gone {
            if let Some(id) = self.ids.remove(&k) {
                runner.bind_mut().despawn(id);
            }
        }
        if order.is_empty() {
            return;
        }
        if !runner.bind_mut().tick(ids, obs) {
            godot_error!("policyport: {}", runner.bind().last_error());
            return;
        }
        let r = runner.bind();
        let (discrete, continuous) = (r.discrete_actions(), r.continuous_actions());
        let k = if order.is_empty() {
            0
        } else {
            (discrete.len() + continuous.len()) / order.len()
        };
        drop(r);
        for (i, mut node) in order.into_iter().enumerate() {
            let action = if discrete.is_empty() {
                PackedFloat32Array::from(&continuous.as_slice()[i * k..(i + 1) * k]).to_variant()
            } else {
                PackedInt64Array::from(&discrete.as_slice()[i * k..(i + 1) * k]).to_variant()
            };
            node.call("policyport_apply", &[action]);
        }
    }
}
