//! A pickle reader that never executes code: the files trainers write (PyTorch's `torch.save`, NumPy arrays inside
//! them) are pickles, and unpickling one with Python runs whatever callables it names. This reader interprets the
//! opcodes into a graph of plain values; a callable (`GLOBAL` / `STACK_GLOBAL`) is accepted only if it is on the
//! allow-list of constructors those files use ([`ALLOWED`]), and calling it (`REDUCE`, `NEWOBJ`, `BUILD`) only records
//! the call as data ([`Node::Call`]) for the format-specific readers to interpret. Anything else is a typed error
//! naming the offending global or opcode.
//!
//! Values live in an arena (the stack and the memo hold indices), so a shared object stays shared and mutations
//! after memoisation (`SETITEMS` on a memoised dict) are seen through every reference, as in Python; and a "pickle
//! bomb" of repeated references costs nothing to read. The arena grows by at most one node per opcode byte, and
//! readers that walk the graph bound their depth ([`MAX_DEPTH`]).

use std::collections::HashMap;

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum PickleError {
    #[error("pickle: truncated at byte {0}")]
    Truncated(usize),
    #[error(
        "pickle: refuses global '{module}.{name}' (only the constructors of PyTorch / NumPy weight files are \
         read; nothing is executed)"
    )]
    ForbiddenGlobal { module: String, name: String },
    #[error("pickle: opcode 0x{opcode:02x} at byte {at} is not supported{why}")]
    UnsupportedOpcode {
        opcode: u8,
        at: usize,
        why: &'static str,
    },
    #[error("pickle: malformed at byte {at}: {detail}")]
    Malformed { at: usize, detail: String },
    #[error("pickle: {0}")]
    TooLarge(String),
    /// Shared references expand past a walker's budget ([`Walk`]): a pickle bomb, not a weight file.
    #[error(
        "pickle: {what} expands past {limit} values through shared references (objects referenced from many \
         places, nested: a pickle bomb, not a trainer's file)"
    )]
    SharedExpansion { what: &'static str, limit: usize },
}

/// Callables a weight file may name. Calls are recorded, never made: the list bounds what readers understand,
/// not what could run (nothing runs). Besides PyTorch and NumPy: the classes of Stable-Baselines3's
/// `VecNormalize.save()` pickle (the object, its `RunningMeanStd` statistics, the gymnasium spaces and NumPy
/// random generators it carries), recorded as data.
pub const ALLOWED: &[(&str, &str)] = &[
    ("collections", "OrderedDict"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch", "FloatStorage"),
    ("torch", "DoubleStorage"),
    ("torch", "HalfStorage"),
    ("torch", "BFloat16Storage"),
    ("torch", "LongStorage"),
    ("torch", "IntStorage"),
    ("torch", "ShortStorage"),
    ("torch", "CharStorage"),
    ("torch", "ByteStorage"),
    ("torch", "BoolStorage"),
    ("torch", "float32"),
    ("torch", "float64"),
    ("torch", "float16"),
    ("torch", "bfloat16"),
    ("torch", "int64"),
    ("torch", "int32"),
    ("torch", "uint8"),
    ("torch", "bool"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    (
        "stable_baselines3.common.vec_env.vec_normalize",
        "VecNormalize",
    ),
    (
        "stable_baselines3.common.running_mean_std",
        "RunningMeanStd",
    ),
    ("gymnasium.spaces.box", "Box"),
    ("gymnasium.spaces.discrete", "Discrete"),
    ("gymnasium.spaces.dict", "Dict"),
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pcg64", "PCG64"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    ("numpy.random.bit_generator", "SeedSequence"),
    ("copyreg", "_reconstructor"),
    ("builtins", "object"),
    // NumPy 2 arrays under pickle protocol 5 (RLlib's module state): `_frombuffer(bytearray, dtype, shape, order)`.
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.numeric", "_frombuffer"),
    ("gymnasium.spaces.multi_discrete", "MultiDiscrete"),
    // RLlib (new API stack) checkpoints: the classes its RLModule and connector files name (recorded, never
    // called: the RLlib route reads the kwargs and spaces next to them).
    (
        "ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module",
        "DefaultPPOTorchRLModule",
    ),
    ("ray.rllib.algorithms.ppo.ppo_catalog", "PPOCatalog"),
    (
        "ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module",
        "DefaultSACTorchRLModule",
    ),
    ("ray.rllib.algorithms.sac.sac_catalog", "SACCatalog"),
    (
        "ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module",
        "DefaultAPPOTorchRLModule",
    ),
    (
        "ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module",
        "DefaultDQNTorchRLModule",
    ),
    ("ray.rllib.algorithms.dqn.dqn_catalog", "DQNCatalog"),
    (
        "ray.rllib.examples.rl_modules.classes.action_masking_rlm",
        "ActionMaskingTorchRLModule",
    ),
    ("ray.rllib.core.rl_module.multi_rl_module", "MultiRLModule"),
    ("ray.rllib.core.rl_module.rl_module", "RLModuleSpec"),
    (
        "ray.rllib.connectors.env_to_module.env_to_module_pipeline",
        "EnvToModulePipeline",
    ),
    (
        "ray.rllib.connectors.env_to_module.mean_std_filter",
        "MeanStdFilter",
    ),
    (
        "ray.rllib.connectors.common.add_observations_from_episodes_to_batch",
        "AddObservationsFromEpisodesToBatch",
    ),
    (
        "ray.rllib.connectors.common.add_time_dim_to_batch_and_zero_pad",
        "AddTimeDimToBatchAndZeroPad",
    ),
    (
        "ray.rllib.connectors.common.add_states_from_episodes_to_batch",
        "AddStatesFromEpisodesToBatch",
    ),
    (
        "ray.rllib.connectors.common.batch_individual_items",
        "BatchIndividualItems",
    ),
    (
        "ray.rllib.connectors.common.numpy_to_tensor",
        "NumpyToTensor",
    ),
    (
        "ray.rllib.connectors.common.flatten_observations",
        "FlattenObservations",
    ),
    // The module-to-env pipeline's default pieces (read for NormalizeAndClipActions' two flags).
    (
        "ray.rllib.connectors.module_to_env.module_to_env_pipeline",
        "ModuleToEnvPipeline",
    ),
    (
        "ray.rllib.connectors.module_to_env.get_actions",
        "GetActions",
    ),
    (
        "ray.rllib.connectors.common.tensor_to_numpy",
        "TensorToNumpy",
    ),
    (
        "ray.rllib.connectors.module_to_env.unbatch_to_individual_items",
        "UnBatchToIndividualItems",
    ),
    (
        "ray.rllib.connectors.module_to_env.remove_single_ts_time_rank_from_batch",
        "RemoveSingleTsTimeRankFromBatch",
    ),
    (
        "ray.rllib.connectors.module_to_env.normalize_and_clip_actions",
        "NormalizeAndClipActions",
    ),
    (
        "ray.rllib.connectors.module_to_env.listify_data_for_vector_env",
        "ListifyDataForVectorEnv",
    ),
    ("torch", "device"),
];

/// Deepest nesting a reader follows (a hostile file can nest lists arbitrarily deep).
pub const MAX_DEPTH: usize = 64;

/// Values a reader may visit when it walks a pickle's graph as a tree (key paths, JSON): a shared object is
/// visited once per reference, so a few dozen dicts that each reference the one below twice are 2^60 paths. Every
/// walker counts its visits against a [`Walk`] and stops with a typed error past its limit: linear time whatever
/// the file, and far above what any weight file or config holds (a state dict has thousands of entries).
pub const MAX_WALK: usize = 1 << 20;

/// A walker's budget of visits ([`MAX_WALK`] unless the reader knows better).
#[derive(Debug)]
pub struct Walk {
    left: usize,
    limit: usize,
    what: &'static str,
}

impl Walk {
    /// `what`: the walk, for the error ("the state dict's keys", "model_config").
    pub fn new(limit: usize, what: &'static str) -> Self {
        Walk {
            left: limit,
            limit,
            what,
        }
    }

    /// Count one visit.
    pub fn step(&mut self) -> Result<(), PickleError> {
        if self.left == 0 {
            return Err(PickleError::SharedExpansion {
                what: self.what,
                limit: self.limit,
            });
        }
        self.left -= 1;
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits (random generator states), as its little-endian two's-complement bytes.
    BigInt(Vec<u8>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<usize>),
    Tuple(Vec<usize>),
    Dict(Vec<(usize, usize)>),
    /// An allow-listed callable.
    Global(String, String),
    /// `callable(*args)` (REDUCE / NEWOBJ), with the state given to `BUILD` afterwards, if any, and the
    /// key/value pairs `SETITEMS` added (an `OrderedDict()` being filled).
    Call {
        func: usize,
        args: usize,
        state: Option<usize>,
        items: Vec<(usize, usize)>,
    },
    /// A persistent reference (`BINPERSID`): PyTorch's storages.
    Persistent(usize),
}

/// A decoded pickle: the arena and the root.
#[derive(Debug)]
pub struct Pickle {
    pub nodes: Vec<Node>,
    pub root: usize,
}

impl Pickle {
    pub fn get(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// The callable of a call node, as `module.name`.
    pub fn call_name(&self, i: usize) -> Option<String> {
        match self.get(i) {
            Node::Call { func, .. } => match self.get(*func) {
                Node::Global(m, n) => Some(format!("{m}.{n}")),
                _ => None,
            },
            _ => None,
        }
    }

    /// Elements of a tuple or list node.
    pub fn items(&self, i: usize) -> Option<&[usize]> {
        match self.get(i) {
            Node::Tuple(v) | Node::List(v) => Some(v),
            _ => None,
        }
    }

    pub fn int(&self, i: usize) -> Option<i64> {
        match self.get(i) {
            Node::Int(v) => Some(*v),
            Node::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    pub fn str(&self, i: usize) -> Option<&str> {
        match self.get(i) {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or(PickleError::Truncated(self.pos))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<usize, PickleError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()) as usize)
    }
    fn u32(&mut self) -> Result<usize, PickleError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()) as usize)
    }
    fn u64(&mut self) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn line(&mut self) -> Result<String, PickleError> {
        let start = self.pos;
        let nl = self.b[start..]
            .iter()
            .position(|c| *c == b'\n')
            .ok_or(PickleError::Truncated(start))?;
        self.pos = start + nl + 1;
        String::from_utf8(self.b[start..start + nl].to_vec()).map_err(|_| PickleError::Malformed {
            at: start,
            detail: "line is not UTF-8".into(),
        })
    }
}

/// Read a pickle (protocols 2 to 5; the text opcodes of protocol 0/1 that name code are refused).
pub fn parse(bytes: &[u8]) -> Result<Pickle, PickleError> {
    let mut r = Reader { b: bytes, pos: 0 };
    let mut nodes: Vec<Node> = vec![];
    let mut stack: Vec<usize> = vec![];
    let mut marks: Vec<usize> = vec![];
    let mut memo: HashMap<usize, usize> = HashMap::new();
    let push = |nodes: &mut Vec<Node>, stack: &mut Vec<usize>, n: Node| {
        nodes.push(n);
        stack.push(nodes.len() - 1);
    };
    loop {
        let at = r.pos;
        let op = r.u8()?;
        let malformed = |detail: &str| PickleError::Malformed {
            at,
            detail: detail.to_string(),
        };
        macro_rules! pop {
            () => {
                stack.pop().ok_or_else(|| malformed("stack underflow"))?
            };
        }
        macro_rules! pop_mark {
            () => {{
                let m = marks.pop().ok_or_else(|| malformed("no mark"))?;
                if m > stack.len() {
                    return Err(malformed("mark above the stack"));
                }
                stack.split_off(m)
            }};
        }
        macro_rules! top {
            () => {
                *stack.last().ok_or_else(|| malformed("empty stack"))?
            };
        }
        match op {
            0x80 => {
                let proto = r.u8()?;
                if proto > 5 {
                    return Err(malformed(&format!("protocol {proto}")));
                }
            }
            0x95 => {
                r.u64()?; // FRAME: a length hint
            }
            b'.' => {
                let root = pop!();
                return Ok(Pickle { nodes, root });
            }
            b'(' => marks.push(stack.len()),
            b'N' => push(&mut nodes, &mut stack, Node::None),
            0x88 => push(&mut nodes, &mut stack, Node::Bool(true)),
            0x89 => push(&mut nodes, &mut stack, Node::Bool(false)),
            b'J' => {
                let v = i32::from_le_bytes(r.take(4)?.try_into().unwrap()) as i64;
                push(&mut nodes, &mut stack, Node::Int(v))
            }
            b'K' => {
                let v = r.u8()? as i64;
                push(&mut nodes, &mut stack, Node::Int(v))
            }
            b'M' => {
                let v = r.u16()? as i64;
                push(&mut nodes, &mut stack, Node::Int(v))
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a {
                    r.u8()? as usize
                } else {
                    r.u32()?
                };
                let b = r.take(n)?;
                if n > 8 {
                    let big = Node::BigInt(b.to_vec());
                    push(&mut nodes, &mut stack, big);
                    continue;
                }
                let mut v: i64 = 0;
                for (i, byte) in b.iter().enumerate() {
                    v |= (*byte as i64) << (8 * i);
                }
                if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                    v -= 1i64 << (8 * n);
                }
                push(&mut nodes, &mut stack, Node::Int(v))
            }
            b'G' => {
                let v = f64::from_be_bytes(r.take(8)?.try_into().unwrap());
                push(&mut nodes, &mut stack, Node::Float(v))
            }
            b'X' | 0x8c | 0x8d => {
                let n = match op {
                    b'X' => r.u32()?,
                    0x8c => r.u8()? as usize,
                    _ => usize::try_from(r.u64()?).map_err(|_| PickleError::Truncated(at))?,
                };
                let s = String::from_utf8(r.take(n)?.to_vec())
                    .map_err(|_| malformed("string is not UTF-8"))?;
                push(&mut nodes, &mut stack, Node::Str(s))
            }
            b'T' | b'U' | b'B' | b'C' | 0x8e | 0x96 => {
                let n = match op {
                    b'U' | b'C' => r.u8()? as usize,
                    b'T' | b'B' => r.u32()?,
                    _ => usize::try_from(r.u64()?).map_err(|_| PickleError::Truncated(at))?,
                };
                let b = r.take(n)?.to_vec();
                push(&mut nodes, &mut stack, Node::Bytes(b))
            }
            b'}' => push(&mut nodes, &mut stack, Node::Dict(vec![])),
            b']' => push(&mut nodes, &mut stack, Node::List(vec![])),
            b')' => push(&mut nodes, &mut stack, Node::Tuple(vec![])),
            0x8f => push(&mut nodes, &mut stack, Node::List(vec![])), // EMPTY_SET, read as a list
            b't' => {
                let items = pop_mark!();
                push(&mut nodes, &mut stack, Node::Tuple(items))
            }
            0x91 => {
                let items = pop_mark!();
                push(&mut nodes, &mut stack, Node::List(items))
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if stack.len() < n {
                    return Err(malformed("stack underflow"));
                }
                let items = stack.split_off(stack.len() - n);
                push(&mut nodes, &mut stack, Node::Tuple(items))
            }
            b'a' => {
                let v = pop!();
                let l = top!();
                match &mut nodes[l] {
                    Node::List(items) => items.push(v),
                    _ => return Err(malformed("APPEND to a non-list")),
                }
            }
            b'e' | 0x90 => {
                let items = pop_mark!();
                let l = top!();
                match &mut nodes[l] {
                    Node::List(v) => v.extend(items),
                    _ => return Err(malformed("APPENDS to a non-list")),
                }
            }
            b's' => {
                let v = pop!();
                let k = pop!();
                let d = top!();
                match &mut nodes[d] {
                    Node::Dict(items) | Node::Call { items, .. } => items.push((k, v)),
                    _ => return Err(malformed("SETITEM on a non-dict")),
                }
            }
            b'u' => {
                let items = pop_mark!();
                if items.len() % 2 != 0 {
                    return Err(malformed("SETITEMS with an odd count"));
                }
                let d = top!();
                match &mut nodes[d] {
                    Node::Dict(v) | Node::Call { items: v, .. } => {
                        v.extend(items.chunks_exact(2).map(|p| (p[0], p[1])))
                    }
                    _ => return Err(malformed("SETITEMS on a non-dict")),
                }
            }
            b'q' | b'r' | 0x94 => {
                let key = match op {
                    b'q' => r.u8()? as usize,
                    b'r' => r.u32()?,
                    _ => memo.len(),
                };
                memo.insert(key, top!());
            }
            b'h' | b'j' => {
                let key = if op == b'h' {
                    r.u8()? as usize
                } else {
                    r.u32()?
                };
                let v = *memo.get(&key).ok_or_else(|| malformed("memo key unset"))?;
                stack.push(v);
            }
            b'0' => {
                pop!();
            }
            b'1' => {
                let _ = pop_mark!();
            }
            b'2' => {
                let v = top!();
                stack.push(v);
            }
            b'c' => {
                let module = r.line()?;
                let name = r.line()?;
                push(&mut nodes, &mut stack, global(module, name)?)
            }
            0x93 => {
                let name = pop!();
                let module = pop!();
                let (Node::Str(m), Node::Str(n)) = (&nodes[module], &nodes[name]) else {
                    return Err(malformed("STACK_GLOBAL of non-strings"));
                };
                let g = global(m.clone(), n.clone())?;
                push(&mut nodes, &mut stack, g)
            }
            // REDUCE, NEWOBJ, NEWOBJ_EX (whose kwargs are dropped): recorded as a call, never made.
            b'R' | 0x81 | 0x92 => {
                if op == 0x92 {
                    let _kwargs = pop!();
                }
                let args = pop!();
                let func = pop!();
                if !matches!(nodes[func], Node::Global(..)) {
                    return Err(malformed("call of a non-global"));
                }
                let call = Node::Call {
                    func,
                    args,
                    state: None,
                    items: vec![],
                };
                push(&mut nodes, &mut stack, call)
            }
            b'b' => {
                let st = pop!();
                let obj = top!();
                match &mut nodes[obj] {
                    Node::Call { state, .. } => *state = Some(st),
                    _ => return Err(malformed("BUILD on a non-object")),
                }
            }
            b'Q' => {
                let pid = pop!();
                push(&mut nodes, &mut stack, Node::Persistent(pid))
            }
            b'i' | b'o' => {
                return Err(PickleError::UnsupportedOpcode {
                    opcode: op,
                    at,
                    why: " (INST / OBJ construct arbitrary classes)",
                });
            }
            _ => {
                return Err(PickleError::UnsupportedOpcode {
                    opcode: op,
                    at,
                    why: "",
                });
            }
        }
    }
}

fn global(module: String, name: String) -> Result<Node, PickleError> {
    if ALLOWED.iter().any(|(m, n)| *m == module && *n == name) {
        Ok(Node::Global(module, name))
    } else {
        Err(PickleError::ForbiddenGlobal { module, name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_executing_globals_are_refused_by_name() {
        // pickle.dumps(os.system) at protocol 2: GLOBAL 'posix system'.
        let evil = b"\x80\x02cposix\nsystem\nq\x00.";
        assert_eq!(
            parse(evil).unwrap_err(),
            PickleError::ForbiddenGlobal {
                module: "posix".into(),
                name: "system".into()
            }
        );
        // The same through STACK_GLOBAL (protocol 4) and a REDUCE.
        let evil4 = b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c\x011\x85R.";
        assert!(matches!(
            parse(evil4).unwrap_err(),
            PickleError::ForbiddenGlobal { name, .. } if name == "eval"
        ));
        assert!(matches!(
            parse(b"(i__builtin__\nlist\n.").unwrap_err(),
            PickleError::UnsupportedOpcode { opcode: b'i', .. }
        ));
    }

    #[test]
    fn truncated_and_malformed_input_is_a_typed_error() {
        for bad in [
            &b""[..],
            b"\x80",
            b"\x80\x02X\xff\xff\xff\xff",
            b"\x80\x02a.",
            b"\x80\x02h\x05.",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn shared_references_are_shared_not_copied() {
        // A list memoised empty and filled afterwards is seen filled through the memo (Python's semantics), and
        // a billion-laughs of references stays one node each.
        let mut p = b"\x80\x02]q\x00(K\x01K\x02e".to_vec();
        for _ in 0..20 {
            p.extend_from_slice(b"h\x00h\x00\x86q\x00");
        }
        p.push(b'.');
        let pk = parse(&p).unwrap();
        assert!(pk.nodes.len() < 100);
    }
}
