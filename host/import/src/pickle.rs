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
    let mut p = Parser {
        r: Reader { b: bytes, pos: 0 },
        nodes: vec![],
        stack: vec![],
        marks: vec![],
        memo: HashMap::new(),
        at: 0,
    };
    loop {
        p.at = p.r.pos;
        let op = p.r.u8()?;
        if let Some(root) = p.opcode(op)? {
            return Ok(Pickle {
                nodes: p.nodes,
                root,
            });
        }
    }
}

/// The interpreter's state between opcodes.
struct Parser<'a> {
    r: Reader<'a>,
    /// The arena every value lives in.
    nodes: Vec<Node>,
    /// Arena indices.
    stack: Vec<usize>,
    /// Stack heights at each MARK not yet consumed.
    marks: Vec<usize>,
    /// Memo key to arena index.
    memo: HashMap<usize, usize>,
    /// Byte offset of the opcode being interpreted, for errors.
    at: usize,
}

impl Parser<'_> {
    /// A [`PickleError::Malformed`] at the current opcode.
    fn malformed(&self, detail: &str) -> PickleError {
        PickleError::Malformed {
            at: self.at,
            detail: detail.to_string(),
        }
    }

    /// Add a node to the arena and push it.
    fn push(&mut self, n: Node) {
        self.nodes.push(n);
        self.stack.push(self.nodes.len() - 1);
    }

    /// Pop the top of the stack.
    fn pop(&mut self) -> Result<usize, PickleError> {
        self.stack
            .pop()
            .ok_or_else(|| self.malformed("stack underflow"))
    }

    /// Pop everything above the last mark, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<usize>, PickleError> {
        let m = self.marks.pop().ok_or_else(|| self.malformed("no mark"))?;
        if m > self.stack.len() {
            return Err(self.malformed("mark above the stack"));
        }
        Ok(self.stack.split_off(m))
    }

    /// The top of the stack, left there.
    fn top(&self) -> Result<usize, PickleError> {
        Ok(*self
            .stack
            .last()
            .ok_or_else(|| self.malformed("empty stack"))?)
    }

    /// Interpret one opcode (its argument bytes follow at the reader's position); `Some(root)` at STOP.
    fn opcode(&mut self, op: u8) -> Result<Option<usize>, PickleError> {
        let at = self.at;
        match op {
            0x80 => {
                let proto = self.r.u8()?;
                if proto > 5 {
                    return Err(self.malformed(&format!("protocol {proto}")));
                }
            }
            0x95 => {
                self.r.u64()?; // FRAME: a length hint
            }
            b'.' => {
                let root = self.pop()?;
                return Ok(Some(root));
            }
            b'(' => self.marks.push(self.stack.len()),
            b'N' => self.push(Node::None),
            0x88 => self.push(Node::Bool(true)),
            0x89 => self.push(Node::Bool(false)),
            b'J' => {
                let v = i32::from_le_bytes(self.r.take(4)?.try_into().unwrap()) as i64;
                self.push(Node::Int(v))
            }
            b'K' => {
                let v = self.r.u8()? as i64;
                self.push(Node::Int(v))
            }
            b'M' => {
                let v = self.r.u16()? as i64;
                self.push(Node::Int(v))
            }
            0x8a | 0x8b => self.long(op)?,
            b'G' => {
                let v = f64::from_be_bytes(self.r.take(8)?.try_into().unwrap());
                self.push(Node::Float(v))
            }
            b'X' | 0x8c | 0x8d => self.unicode(op)?,
            b'T' | b'U' | b'B' | b'C' | 0x8e | 0x96 => self.bytes(op)?,
            b'}' => self.push(Node::Dict(vec![])),
            b']' => self.push(Node::List(vec![])),
            b')' => self.push(Node::Tuple(vec![])),
            0x8f => self.push(Node::List(vec![])), // EMPTY_SET, read as a list
            b't' => {
                let items = self.pop_mark()?;
                self.push(Node::Tuple(items))
            }
            0x91 => {
                let items = self.pop_mark()?;
                self.push(Node::List(items))
            }
            0x85..=0x87 => self.small_tuple(op)?,
            b'a' => self.append()?,
            b'e' | 0x90 => self.appends()?,
            b's' => self.set_item()?,
            b'u' => self.set_items()?,
            b'q' | b'r' | 0x94 => self.memo_put(op)?,
            b'h' | b'j' => self.memo_get(op)?,
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                let _ = self.pop_mark()?;
            }
            b'2' => {
                let v = self.top()?;
                self.stack.push(v);
            }
            b'c' => {
                let module = self.r.line()?;
                let name = self.r.line()?;
                self.push(global(module, name)?)
            }
            0x93 => self.stack_global()?,
            b'R' | 0x81 | 0x92 => self.call(op)?,
            b'b' => self.build()?,
            b'Q' => {
                let pid = self.pop()?;
                self.push(Node::Persistent(pid))
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
        Ok(None)
    }

    /// LONG1 / LONG4: a little-endian two's-complement integer, wider than 64 bits as [`Node::BigInt`].
    fn long(&mut self, op: u8) -> Result<(), PickleError> {
        let n = if op == 0x8a {
            self.r.u8()? as usize
        } else {
            self.r.u32()?
        };
        let b = self.r.take(n)?;
        if n > 8 {
            let big = Node::BigInt(b.to_vec());
            self.push(big);
            return Ok(());
        }
        let mut v: i64 = 0;
        for (i, byte) in b.iter().enumerate() {
            v |= (*byte as i64) << (8 * i);
        }
        if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
            v -= 1i64 << (8 * n);
        }
        self.push(Node::Int(v));
        Ok(())
    }

    /// BINUNICODE / SHORT_BINUNICODE / BINUNICODE8: a UTF-8 string.
    fn unicode(&mut self, op: u8) -> Result<(), PickleError> {
        let n = match op {
            b'X' => self.r.u32()?,
            0x8c => self.r.u8()? as usize,
            _ => usize::try_from(self.r.u64()?).map_err(|_| PickleError::Truncated(self.at))?,
        };
        let s = String::from_utf8(self.r.take(n)?.to_vec())
            .map_err(|_| self.malformed("string is not UTF-8"))?;
        self.push(Node::Str(s));
        Ok(())
    }

    /// BINSTRING / SHORT_BINSTRING / BINBYTES / SHORT_BINBYTES / BINBYTES8 / BYTEARRAY8: raw bytes.
    fn bytes(&mut self, op: u8) -> Result<(), PickleError> {
        let n = match op {
            b'U' | b'C' => self.r.u8()? as usize,
            b'T' | b'B' => self.r.u32()?,
            _ => usize::try_from(self.r.u64()?).map_err(|_| PickleError::Truncated(self.at))?,
        };
        let b = self.r.take(n)?.to_vec();
        self.push(Node::Bytes(b));
        Ok(())
    }

    /// TUPLE1 / TUPLE2 / TUPLE3: a tuple of the top one to three values.
    fn small_tuple(&mut self, op: u8) -> Result<(), PickleError> {
        let n = (op - 0x84) as usize;
        if self.stack.len() < n {
            return Err(self.malformed("stack underflow"));
        }
        let items = self.stack.split_off(self.stack.len() - n);
        self.push(Node::Tuple(items));
        Ok(())
    }

    /// APPEND: the top value onto the list below it.
    fn append(&mut self) -> Result<(), PickleError> {
        let v = self.pop()?;
        let l = self.top()?;
        match &mut self.nodes[l] {
            Node::List(items) => items.push(v),
            _ => return Err(self.malformed("APPEND to a non-list")),
        }
        Ok(())
    }

    /// APPENDS / ADDITEMS: the values above the mark onto the list below it (a set is read as a list).
    fn appends(&mut self) -> Result<(), PickleError> {
        let items = self.pop_mark()?;
        let l = self.top()?;
        match &mut self.nodes[l] {
            Node::List(v) => v.extend(items),
            _ => return Err(self.malformed("APPENDS to a non-list")),
        }
        Ok(())
    }

    /// SETITEM: the top key/value pair into the dict (or dict-like call) below it.
    fn set_item(&mut self) -> Result<(), PickleError> {
        let v = self.pop()?;
        let k = self.pop()?;
        let d = self.top()?;
        match &mut self.nodes[d] {
            Node::Dict(items) | Node::Call { items, .. } => items.push((k, v)),
            _ => return Err(self.malformed("SETITEM on a non-dict")),
        }
        Ok(())
    }

    /// SETITEMS: the key/value pairs above the mark into the dict (or dict-like call) below it.
    fn set_items(&mut self) -> Result<(), PickleError> {
        let items = self.pop_mark()?;
        if items.len() % 2 != 0 {
            return Err(self.malformed("SETITEMS with an odd count"));
        }
        let d = self.top()?;
        match &mut self.nodes[d] {
            Node::Dict(v) | Node::Call { items: v, .. } => {
                v.extend(items.chunks_exact(2).map(|p| (p[0], p[1])))
            }
            _ => return Err(self.malformed("SETITEMS on a non-dict")),
        }
        Ok(())
    }

    /// BINPUT / LONG_BINPUT / MEMOIZE: remember the top of the stack.
    fn memo_put(&mut self, op: u8) -> Result<(), PickleError> {
        let key = match op {
            b'q' => self.r.u8()? as usize,
            b'r' => self.r.u32()?,
            _ => self.memo.len(),
        };
        let v = self.top()?;
        self.memo.insert(key, v);
        Ok(())
    }

    /// BINGET / LONG_BINGET: push a remembered value (the same node, not a copy).
    fn memo_get(&mut self, op: u8) -> Result<(), PickleError> {
        let key = if op == b'h' {
            self.r.u8()? as usize
        } else {
            self.r.u32()?
        };
        let v = *self
            .memo
            .get(&key)
            .ok_or_else(|| self.malformed("memo key unset"))?;
        self.stack.push(v);
        Ok(())
    }

    /// STACK_GLOBAL: the allow-listed callable named by the two strings on top.
    fn stack_global(&mut self) -> Result<(), PickleError> {
        let name = self.pop()?;
        let module = self.pop()?;
        let (Node::Str(m), Node::Str(n)) = (&self.nodes[module], &self.nodes[name]) else {
            return Err(self.malformed("STACK_GLOBAL of non-strings"));
        };
        let g = global(m.clone(), n.clone())?;
        self.push(g);
        Ok(())
    }

    /// REDUCE, NEWOBJ, NEWOBJ_EX (whose kwargs are dropped): recorded as a call, never made (a [`Node::Call`] of
    /// the global below the arguments).
    fn call(&mut self, op: u8) -> Result<(), PickleError> {
        if op == 0x92 {
            let _kwargs = self.pop()?;
        }
        let args = self.pop()?;
        let func = self.pop()?;
        if !matches!(self.nodes[func], Node::Global(..)) {
            return Err(self.malformed("call of a non-global"));
        }
        let call = Node::Call {
            func,
            args,
            state: None,
            items: vec![],
        };
        self.push(call);
        Ok(())
    }

    /// BUILD: the top value as the state of the call below it.
    fn build(&mut self) -> Result<(), PickleError> {
        let st = self.pop()?;
        let obj = self.top()?;
        match &mut self.nodes[obj] {
            Node::Call { state, .. } => *state = Some(st),
            _ => return Err(self.malformed("BUILD on a non-object")),
        }
        Ok(())
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
