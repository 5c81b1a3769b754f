//! The slice of Godot 3's GDNative C API this library calls, declared by hand.
//!
//! Why by hand and not `gdnative-sys`: that crate generates its bindings with bindgen at build time, which needs
//! libclang on every machine that builds the workspace, and its `GodotApi::from_raw` insists on every API
//! version of Godot 3.5 (so a Godot 3.2 engine, Debian's, is refused). What a NativeScript class needs is small
//! and frozen: Godot passes `godot_gdnative_init` a pointer to its *core 1.0* API struct — a header followed by
//! function pointers in a fixed order that never changed within Godot 3 (later functions went into chained
//! `next` structs: core 1.1, 1.2) — and lists the NativeScript 1.0 extension among `extensions`. This file names
//! the functions it calls by their index in those structs (the order of Godot 3's `gdnative_api.json`, where
//! index 0 is the first function after the header) and their C signatures.
//!
//! What checks the indices: [`Api::from_init`] refuses an engine whose API struct is not core 1.x with the
//! NativeScript 1.x extension, then calls a handful of the functions on values it made and checks the answers
//! (an int variant reads back, a string keeps its bytes, a pool array its length) before anything is registered;
//! and CI runs Debian's Godot 3.2 server on a scene that must reproduce the C example's episodes exactly
//! (tests/scripts/godot3-test.sh). Types: `godot_bool` is C `bool`, `godot_int` C `int`, `godot_real` C `float`;
//! the opaque handles (`godot_string`, `godot_array`, pool arrays, `godot_dictionary`, `godot_char_string`) are
//! one pointer wide and `godot_variant` 24 bytes (16 + a pointer), returned through a hidden pointer like any C
//! struct of that size.

use std::ffi::{c_char, c_int, c_void};

/// `godot_gdnative_api_version`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ApiVersion {
    pub major: u32,
    pub minor: u32,
}

/// `godot_gdnative_api_struct`: the header every API struct starts with.
#[repr(C)]
pub struct ApiHeader {
    pub kind: u32,
    pub version: ApiVersion,
    pub next: *const ApiHeader,
}

/// `godot_gdnative_core_api_struct` (core 1.0): the header, the extensions, then the function pointers.
#[repr(C)]
pub struct CoreApi {
    pub kind: u32,
    pub version: ApiVersion,
    pub next: *const ApiHeader,
    pub num_extensions: u32,
    pub extensions: *const *const ApiHeader,
    functions: [*const c_void; 0],
}

/// `godot_gdnative_ext_nativescript_api_struct` (1.0).
#[repr(C)]
pub struct NativeScriptApi {
    pub header: ApiHeader,
    functions: [*const c_void; 0],
}

/// `godot_gdnative_init_options`.
#[repr(C)]
pub struct InitOptions {
    pub in_editor: bool,
    pub core_api_hash: u64,
    pub editor_api_hash: u64,
    pub no_api_hash: u64,
    pub report_version_mismatch:
        Option<unsafe extern "C" fn(*const c_void, *const c_char, ApiVersion, ApiVersion)>,
    pub report_loading_error: Option<unsafe extern "C" fn(*const c_void, *const c_char)>,
    pub gd_native_library: *const c_void,
    pub api_struct: *const CoreApi,
    pub active_library_path: *const c_void,
}

/// `GDNATIVE_CORE` and `GDNATIVE_EXT_NATIVESCRIPT` of `enum GDNATIVE_API_TYPES`.
pub const API_CORE: u32 = 0;
pub const API_NATIVESCRIPT: u32 = 1;

/// `godot_variant`: 16 bytes + a pointer, 8-aligned (Godot reads it as its `Variant`).
#[repr(C, align(8))]
pub struct Variant([u8; 24]);

impl Variant {
    /// All zero bytes: what `uninit` gives (Godot's nil variant is type 0).
    pub const NIL: Variant = Variant([0; 24]);

    /// Storage for a constructor (`godot_variant_new_*`) to write into.
    pub fn uninit() -> Self {
        Variant([0; 24])
    }
}

/// The type of a variant read in place (Godot 3's `Variant::type`, at offset 0): only where
/// [`Api::probe_ints_in_place`] found this layout.
///
/// # Safety
/// `v` points to a live variant.
unsafe fn type_in_place(v: *const Variant) -> i32 {
    // SAFETY: a live 24-byte, 8-aligned variant; its first 4 bytes are read as the probe compared them.
    unsafe { v.cast::<i32>().read() }
}

/// The `int64_t` of an int variant read in place (offset 8, the 8-aligned data union).
///
/// # Safety
/// `v` points to a live variant of type int.
unsafe fn int_in_place(v: *const Variant) -> i64 {
    // SAFETY: bytes 8..16 of a live 8-aligned 24-byte variant.
    unsafe { v.cast::<u8>().add(8).cast::<i64>().read() }
}

/// One pointer-wide opaque handle (`godot_string`, `godot_array`, `godot_pool_*_array`, `godot_dictionary`,
/// `godot_char_string`); each is a distinct type below so they cannot be mixed up.
macro_rules! handle {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[repr(C)]
        pub struct $name(*mut c_void);
        impl $name {
            pub fn uninit() -> Self {
                $name(std::ptr::null_mut())
            }
        }
    )*};
}
handle! {
    GString;
    CharString;
    Array;
    Dictionary;
    PoolByteArray;
    PoolIntArray;
    PoolRealArray;
}

/// `godot_variant_type` values this library reads (Godot 3's `Variant::Type`).
pub mod variant_type {
    pub const NIL: i32 = 0;
    pub const BOOL: i32 = 1;
    pub const INT: i32 = 2;
    pub const REAL: i32 = 3;
    pub const STRING: i32 = 4;
    pub const ARRAY: i32 = 19;
    pub const POOL_BYTE_ARRAY: i32 = 20;
    pub const POOL_INT_ARRAY: i32 = 21;
    pub const POOL_REAL_ARRAY: i32 = 22;

    /// Godot's name of a variant type, for error messages.
    pub fn name(t: i32) -> &'static str {
        match t {
            NIL => "null",
            BOOL => "bool",
            INT => "int",
            REAL => "float",
            STRING => "String",
            5..=16 => "a math or engine value",
            17 => "Object",
            18 => "Dictionary",
            ARRAY => "Array",
            POOL_BYTE_ARRAY => "PoolByteArray",
            POOL_INT_ARRAY => "PoolIntArray",
            POOL_REAL_ARRAY => "PoolRealArray",
            _ => "another pool array",
        }
    }
}

pub type Object = c_void;
/// `godot_instance_create_func`.
#[repr(C)]
pub struct InstanceCreate {
    pub create: unsafe extern "C" fn(*mut Object, *mut c_void) -> *mut c_void,
    pub method_data: *mut c_void,
    pub free: Option<unsafe extern "C" fn(*mut c_void)>,
}
/// `godot_instance_destroy_func`.
#[repr(C)]
pub struct InstanceDestroy {
    pub destroy: unsafe extern "C" fn(*mut Object, *mut c_void, *mut c_void),
    pub method_data: *mut c_void,
    pub free: Option<unsafe extern "C" fn(*mut c_void)>,
}
/// A NativeScript method: instance, method data, user data, argument count, arguments.
pub type MethodFn = unsafe extern "C" fn(
    *mut Object,
    *mut c_void,
    *mut c_void,
    c_int,
    *mut *mut Variant,
) -> Variant;
/// `godot_instance_method`.
#[repr(C)]
pub struct InstanceMethod {
    pub method: MethodFn,
    pub method_data: *mut c_void,
    pub free: Option<unsafe extern "C" fn(*mut c_void)>,
}
/// `godot_method_attributes` (`rpc_type`: 0, disabled).
#[repr(C)]
pub struct MethodAttributes {
    pub rpc_type: c_int,
}

/// The engine's API structs, found in `godot_gdnative_init`'s options.
#[derive(Clone, Copy)]
pub struct Api {
    core: *const CoreApi,
    nativescript: *const NativeScriptApi,
    /// Whether an Array's int elements may be read in place ([`Api::array_ints`]): found by
    /// [`Api::probe_ints_in_place`] when the API is taken.
    ints_in_place: bool,
}

// SAFETY: the API structs are immutable tables of function pointers that live as long as the engine; Godot calls
// this library's entry points from its main thread, and nothing here mutates the tables.
unsafe impl Send for Api {}
// SAFETY: as above: shared read-only access to static tables.
unsafe impl Sync for Api {}

/// Why the engine's API was not taken.
#[derive(Debug, PartialEq)]
pub enum ApiError {
    Null,
    NotCore { kind: u32, major: u32 },
    NoNativeScript,
    SelfCheck(&'static str),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Null => write!(f, "the engine passed no API struct"),
            ApiError::NotCore { kind, major } => write!(
                f,
                "the engine's API struct is type {kind} version {major}.x, not GDNative core 1.x (a Godot 3 engine)"
            ),
            ApiError::NoNativeScript => {
                write!(f, "the engine lists no NativeScript 1.x extension")
            }
            ApiError::SelfCheck(what) => write!(
                f,
                "the engine's core API does not behave as Godot 3's core 1.0 ({what}): not loading"
            ),
        }
    }
}

/// `name = index : fn(args) -> ret` for each core 1.0 function called, as typed accessors on [`Api`] and as
/// [`CORE_FUNCTIONS`] (name, index) for anyone checking them against an engine's `gdnative_api.json`.
macro_rules! core_functions {
    ($($name:ident = $index:literal : fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// (C name, index in the core 1.0 struct) of every function this library calls.
        pub const CORE_FUNCTIONS: &[(&str, usize)] = &[$((concat!("godot_", stringify!($name)), $index)),*];
        #[allow(dead_code)]
        impl Api {
            $(
                pub fn $name(&self) -> unsafe extern "C" fn($($arg),*) $(-> $ret)? {
                    // SAFETY: `core` was checked non-null and of type core 1.x in `from_init`; core 1.0's table
                    // holds at least as many entries as its highest index used here (743 < 744), and entry
                    // `$index` has this C signature (the table above).
                    unsafe {
                        let slot = (*self.core).functions.as_ptr().add($index);
                        std::mem::transmute::<*const c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(*slot)
                    }
                }
            )*
        }
    };
}

core_functions! {
    pool_byte_array_read = 165: fn(*const PoolByteArray) -> *mut c_void;
    pool_byte_array_size = 169: fn(*const PoolByteArray) -> c_int;
    pool_byte_array_destroy = 170: fn(*mut PoolByteArray);
    pool_int_array_new = 171: fn(*mut PoolIntArray);
    pool_int_array_resize = 180: fn(*mut PoolIntArray, c_int);
    pool_int_array_write = 182: fn(*mut PoolIntArray) -> *mut c_void;
    pool_int_array_size = 185: fn(*const PoolIntArray) -> c_int;
    pool_int_array_destroy = 186: fn(*mut PoolIntArray);
    pool_real_array_new = 187: fn(*mut PoolRealArray);
    pool_real_array_resize = 196: fn(*mut PoolRealArray, c_int);
    pool_real_array_read = 197: fn(*const PoolRealArray) -> *mut c_void;
    pool_real_array_write = 198: fn(*mut PoolRealArray) -> *mut c_void;
    pool_real_array_size = 201: fn(*const PoolRealArray) -> c_int;
    pool_real_array_destroy = 202: fn(*mut PoolRealArray);
    pool_byte_array_read_access_ptr = 268: fn(*const c_void) -> *const u8;
    pool_byte_array_read_access_destroy = 270: fn(*mut c_void);
    pool_real_array_read_access_ptr = 276: fn(*const c_void) -> *const f32;
    pool_real_array_read_access_destroy = 278: fn(*mut c_void);
    pool_int_array_write_access_ptr = 300: fn(*const c_void) -> *mut i32;
    pool_int_array_write_access_destroy = 302: fn(*mut c_void);
    pool_real_array_write_access_ptr = 304: fn(*const c_void) -> *mut f32;
    pool_real_array_write_access_destroy = 306: fn(*mut c_void);
    array_new = 323: fn(*mut Array);
    array_operator_index_const = 335: fn(*const Array, c_int) -> *const Variant;
    array_append = 336: fn(*mut Array, *const Variant);
    array_size = 356: fn(*const Array) -> c_int;
    array_destroy = 361: fn(*mut Array);
    dictionary_new = 362: fn(*mut Dictionary);
    dictionary_destroy = 364: fn(*mut Dictionary);
    dictionary_set = 375: fn(*mut Dictionary, *const Variant, *const Variant);
    variant_get_type = 507: fn(*const Variant) -> c_int;
    variant_new_nil = 509: fn(*mut Variant);
    variant_new_bool = 510: fn(*mut Variant, bool);
    variant_new_int = 512: fn(*mut Variant, i64);
    variant_new_real = 513: fn(*mut Variant, f64);
    variant_new_string = 514: fn(*mut Variant, *const GString);
    variant_new_dictionary = 528: fn(*mut Variant, *const Dictionary);
    variant_new_pool_int_array = 531: fn(*mut Variant, *const PoolIntArray);
    variant_new_pool_real_array = 532: fn(*mut Variant, *const PoolRealArray);
    variant_as_bool = 537: fn(*const Variant) -> bool;
    variant_as_int = 539: fn(*const Variant) -> i64;
    variant_as_string = 541: fn(*const Variant) -> GString;
    variant_as_array = 556: fn(*const Variant) -> Array;
    variant_as_pool_byte_array = 557: fn(*const Variant) -> PoolByteArray;
    variant_as_pool_real_array = 559: fn(*const Variant) -> PoolRealArray;
    variant_destroy = 570: fn(*mut Variant);
    char_string_length = 571: fn(*const CharString) -> c_int;
    char_string_get_data = 572: fn(*const CharString) -> *const c_char;
    char_string_destroy = 573: fn(*mut CharString);
    string_utf8 = 678: fn(*const GString) -> CharString;
    string_chars_to_utf8_with_len = 682: fn(*const c_char, c_int) -> GString;
    string_destroy = 721: fn(*mut GString);
}

/// The NativeScript 1.0 functions called, by index.
const NS_REGISTER_CLASS: usize = 0;
const NS_REGISTER_METHOD: usize = 2;

impl Api {
    /// The engine's API from `godot_gdnative_init`'s options, checked (see the module docs).
    ///
    /// # Safety
    /// `options` is what Godot passed to `godot_gdnative_init` (or null).
    pub unsafe fn from_init(options: *const InitOptions) -> Result<Api, ApiError> {
        // SAFETY: the caller passes Godot's options; every pointer read is checked non-null first.
        unsafe {
            if options.is_null() || (*options).api_struct.is_null() {
                return Err(ApiError::Null);
            }
            let core = (*options).api_struct;
            if (*core).kind != API_CORE || (*core).version.major != 1 {
                return Err(ApiError::NotCore {
                    kind: (*core).kind,
                    major: (*core).version.major,
                });
            }
            let mut nativescript = std::ptr::null();
            if !(*core).extensions.is_null() {
                for i in 0..(*core).num_extensions as usize {
                    let ext = *(*core).extensions.add(i);
                    if !ext.is_null()
                        && (*ext).kind == API_NATIVESCRIPT
                        && (*ext).version.major == 1
                    {
                        nativescript = ext as *const NativeScriptApi;
                        break;
                    }
                }
            }
            if nativescript.is_null() {
                return Err(ApiError::NoNativeScript);
            }
            let mut api = Api {
                core,
                nativescript,
                ints_in_place: false,
            };
            api.self_check()?;
            api.ints_in_place = api.probe_ints_in_place();
            Ok(api)
        }
    }

    /// Values made through the table read back as made: a table of another layout would call other functions
    /// and answer otherwise (or, at worst, crash here, while the game loads, not mid-frame).
    fn self_check(&self) -> Result<(), ApiError> {
        let mut v = Variant::uninit();
        // SAFETY: each call passes storage of the type its C signature names; each value made is destroyed.
        unsafe {
            self.variant_new_int()(&mut v, -1234567890123);
            let (t, i) = (self.variant_get_type()(&v), self.variant_as_int()(&v));
            self.variant_destroy()(&mut v);
            if t != variant_type::INT || i != -1234567890123 {
                return Err(ApiError::SelfCheck("an int variant"));
            }
            let s = self.string("policyport ✓");
            if self.rust_string(&s) != "policyport ✓" {
                let mut s = s;
                self.string_destroy()(&mut s);
                return Err(ApiError::SelfCheck("a String's UTF-8"));
            }
            let mut s = s;
            self.variant_new_string()(&mut v, &s);
            self.string_destroy()(&mut s);
            let t = self.variant_get_type()(&v);
            self.variant_destroy()(&mut v);
            if t != variant_type::STRING {
                return Err(ApiError::SelfCheck("a String variant"));
            }
            let a = self.pool_real_array(&[1.5, -2.0, 3.25]);
            self.variant_new_pool_real_array()(&mut v, &a);
            let mut a = a;
            self.pool_real_array_destroy()(&mut a);
            let t = self.variant_get_type()(&v);
            let back = self.with_f32s(&v, <[f32]>::to_vec);
            self.variant_destroy()(&mut v);
            if t != variant_type::POOL_REAL_ARRAY || back != [1.5, -2.0, 3.25] {
                return Err(ApiError::SelfCheck("a PoolRealArray"));
            }
        }
        Ok(())
    }

    /// Whether this engine's Array elements can be read in place, as Godot 3's `Variant` lays them out: an
    /// Array is one contiguous `Vector<Variant>` of `godot_variant`-sized (24-byte) elements — GDNative fixes
    /// that size — and a `Variant` is its `Type` (a C++ enum, 32 bits) at offset 0 and its 8-aligned data union
    /// at offset 8, where an int is its `int64_t`. None of this is in GDNative's contract (a `godot_variant` is
    /// `_dont_touch_that` bytes), so it is not assumed: an Array of ints, floats, a String, a bool and a null made
    /// through the API must read, element by element, the same types and ints in place as through
    /// `godot_variant_get_type` / `godot_variant_as_int`, at the addresses a 24-byte stride gives. Any engine
    /// where one differs reads every id through the API instead (what all ids were read with before).
    ///
    /// Why bother: `tick(ids, ...)` takes the ids as an Array of ints (a PoolIntArray holds 32 bits; ids are
    /// 64) and three API calls per element were ~10 ns of an agent's ~25 ns of overhead in a 100-agent tick
    /// (measured on Godot 3.2.3, docs/benchmarks/2026-12-06-amd-zen3-2core/engine.md).
    fn probe_ints_in_place(&self) -> bool {
        const INTS: [i64; 6] = [0, 1, -1, 7 | (1 << 40), -(1 << 33), i64::MAX];
        let mut a = Array::uninit();
        let mut ok = true;
        // SAFETY: every value is made through the API into storage of its type and destroyed; the array's
        // elements are read within its size while `a` holds it (the in-place reads are of a `Variant`-sized
        // element the API itself pointed at, or at the stride from the first, compared before any is read).
        unsafe {
            self.array_new()(&mut a);
            let mut v = Variant::uninit();
            for i in INTS {
                self.variant_new_int()(&mut v, i);
                self.array_append()(&mut a, &v);
                self.variant_destroy()(&mut v);
            }
            self.variant_new_real()(&mut v, 2.5);
            self.array_append()(&mut a, &v);
            self.variant_destroy()(&mut v);
            let mut s = self.string_variant("12");
            self.array_append()(&mut a, &s);
            self.variant_destroy()(&mut s);
            let mut b = self.bool_variant(true);
            self.array_append()(&mut a, &b);
            self.variant_destroy()(&mut b);
            let mut nil = self.nil();
            self.array_append()(&mut a, &nil);
            self.variant_destroy()(&mut nil);
            let n = self.array_size()(&a);
            ok &= n == INTS.len() as c_int + 4;
            let first = self.array_operator_index_const()(&a, 0);
            ok &= !first.is_null();
            for i in 0..n.max(0) {
                if !ok {
                    break;
                }
                let e = self.array_operator_index_const()(&a, i);
                ok &= e == first.wrapping_add(i as usize);
                if ok {
                    let t = self.variant_get_type()(e);
                    ok &= type_in_place(e) == t;
                    if t == variant_type::INT {
                        let want = INTS.get(i as usize).copied();
                        ok &=
                            want == Some(self.variant_as_int()(e)) && want == Some(int_in_place(e));
                    } else {
                        ok &= i as usize >= INTS.len();
                    }
                }
            }
            self.array_destroy()(&mut a);
        }
        ok
    }

    /// Whether [`Api::array_ints`] reads ints in place on this engine ([`Api::probe_ints_in_place`]).
    pub fn ints_in_place(&self) -> bool {
        self.ints_in_place
    }

    /// `godot_nativescript_register_class`.
    ///
    /// # Safety
    /// `handle` is the one Godot passed to `godot_nativescript_init`.
    pub unsafe fn register_class(
        &self,
        handle: *mut c_void,
        name: &std::ffi::CStr,
        base: &std::ffi::CStr,
        create: InstanceCreate,
        destroy: InstanceDestroy,
    ) {
        type F = unsafe extern "C" fn(
            *mut c_void,
            *const c_char,
            *const c_char,
            InstanceCreate,
            InstanceDestroy,
        );
        // SAFETY: index 0 of NativeScript 1.0 is register_class with this signature; `nativescript` was found
        // in `from_init`.
        unsafe {
            let f: F = std::mem::transmute::<*const c_void, F>(
                *(*self.nativescript)
                    .functions
                    .as_ptr()
                    .add(NS_REGISTER_CLASS),
            );
            f(handle, name.as_ptr(), base.as_ptr(), create, destroy);
        }
    }

    /// `godot_nativescript_register_method`.
    ///
    /// # Safety
    /// `handle` is the one Godot passed to `godot_nativescript_init`; the class is registered.
    pub unsafe fn register_method(
        &self,
        handle: *mut c_void,
        class: &std::ffi::CStr,
        name: &std::ffi::CStr,
        method: InstanceMethod,
    ) {
        type F = unsafe extern "C" fn(
            *mut c_void,
            *const c_char,
            *const c_char,
            MethodAttributes,
            InstanceMethod,
        );
        // SAFETY: index 2 of NativeScript 1.0 is register_method with this signature.
        unsafe {
            let f: F = std::mem::transmute::<*const c_void, F>(
                *(*self.nativescript)
                    .functions
                    .as_ptr()
                    .add(NS_REGISTER_METHOD),
            );
            f(
                handle,
                class.as_ptr(),
                name.as_ptr(),
                MethodAttributes { rpc_type: 0 },
                method,
            );
        }
    }

    // ---- helpers over the table (each owns what it makes and destroys what it borrows) ----

    /// A new Godot String holding `s` (the caller destroys it).
    pub fn string(&self, s: &str) -> GString {
        let len = c_int::try_from(s.len()).unwrap_or(c_int::MAX);
        // SAFETY: `s` is valid for `len` bytes of UTF-8.
        unsafe { self.string_chars_to_utf8_with_len()(s.as_ptr().cast(), len) }
    }

    /// The UTF-8 text of a Godot String.
    pub fn rust_string(&self, s: &GString) -> String {
        // SAFETY: `s` is a live String; the char string made from it is read within its length, then destroyed.
        unsafe {
            let mut cs = self.string_utf8()(s);
            let (p, n) = (
                self.char_string_get_data()(&cs),
                self.char_string_length()(&cs),
            );
            let text = if p.is_null() || n <= 0 {
                String::new()
            } else {
                String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), n as usize))
                    .into_owned()
            };
            self.char_string_destroy()(&mut cs);
            text
        }
    }

    /// A new PoolRealArray holding `xs` (the caller destroys it).
    pub fn pool_real_array(&self, xs: &[f32]) -> PoolRealArray {
        let mut a = PoolRealArray::uninit();
        // SAFETY: `a` is made, sized, then written within its size through a write access that is released.
        unsafe {
            self.pool_real_array_new()(&mut a);
            if !xs.is_empty() {
                self.pool_real_array_resize()(&mut a, xs.len() as c_int);
                let w = self.pool_real_array_write()(&mut a);
                let p = self.pool_real_array_write_access_ptr()(w);
                std::ptr::copy_nonoverlapping(xs.as_ptr(), p, xs.len());
                self.pool_real_array_write_access_destroy()(w);
            }
        }
        a
    }

    /// A new PoolIntArray holding `xs` (Godot 3's PoolIntArray holds 32-bit ints; the caller destroys it).
    pub fn pool_int_array(&self, xs: impl ExactSizeIterator<Item = i32>) -> PoolIntArray {
        let mut a = PoolIntArray::uninit();
        // SAFETY: `a` is storage for a PoolIntArray.
        unsafe { self.pool_int_array_new()(&mut a) };
        self.write_pool_int_array(&mut a, xs);
        a
    }

    /// Makes `a` hold exactly `xs` (Godot copies the array first where another reference shares it: pool arrays
    /// are copy-on-write, so a holder of the old contents keeps them).
    pub fn write_pool_int_array(
        &self,
        a: &mut PoolIntArray,
        xs: impl ExactSizeIterator<Item = i32>,
    ) {
        let n = xs.len();
        // SAFETY: `a` is a live array, sized, then written within its size through a write access that is
        // released.
        unsafe {
            if self.pool_int_array_size()(a) != n as c_int {
                self.pool_int_array_resize()(a, n as c_int);
            }
            if n > 0 {
                let w = self.pool_int_array_write()(a);
                let p = self.pool_int_array_write_access_ptr()(w);
                for (i, x) in xs.enumerate().take(n) {
                    *p.add(i) = x;
                }
                self.pool_int_array_write_access_destroy()(w);
            }
        }
    }

    /// A variant holding another reference to `a` (which stays the caller's).
    pub fn pool_int_array_variant(&self, a: &PoolIntArray) -> Variant {
        let mut v = Variant::uninit();
        // SAFETY: the variant takes its own reference to the live array.
        unsafe { self.variant_new_pool_int_array()(&mut v, a) };
        v
    }

    /// Calls `f` on the floats of a variant Godot converts to a PoolRealArray (a PoolRealArray — read where it
    /// is, no copy: a batch of frames is 113 MB at 1 000 NatureCNN agents — or an Array of numbers).
    ///
    /// # Safety
    /// `v` is a live variant.
    pub unsafe fn with_f32s<R>(&self, v: &Variant, f: impl FnOnce(&[f32]) -> R) -> R {
        // SAFETY: the array converted from `v` is read within its size through a read access; both are released
        // before returning.
        unsafe {
            let mut a = self.variant_as_pool_real_array()(v);
            let n = self.pool_real_array_size()(&a).max(0) as usize;
            let r = if n > 0 {
                let acc = self.pool_real_array_read()(&a);
                let p = self.pool_real_array_read_access_ptr()(acc);
                let r = f(std::slice::from_raw_parts(p, n));
                self.pool_real_array_read_access_destroy()(acc);
                r
            } else {
                f(&[])
            };
            self.pool_real_array_destroy()(&mut a);
            r
        }
    }

    /// Calls `f` on the bytes of a PoolByteArray variant.
    ///
    /// # Safety
    /// `v` is a live variant of type PoolByteArray.
    pub unsafe fn with_bytes<R>(&self, v: &Variant, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: read within the array's size through a read access; both released before returning.
        unsafe {
            let mut a = self.variant_as_pool_byte_array()(v);
            let n = self.pool_byte_array_size()(&a).max(0) as usize;
            let r = if n > 0 {
                let acc = self.pool_byte_array_read()(&a);
                let p = self.pool_byte_array_read_access_ptr()(acc);
                let r = f(std::slice::from_raw_parts(p, n));
                self.pool_byte_array_read_access_destroy()(acc);
                r
            } else {
                f(&[])
            };
            self.pool_byte_array_destroy()(&mut a);
            r
        }
    }

    /// The elements of an Array variant, each as an int; the index and type of the first that is not one.
    ///
    /// # Safety
    /// `v` is a live variant of type Array.
    pub unsafe fn array_ints(&self, v: &Variant, out: &mut Vec<i64>) -> Result<(), (usize, i32)> {
        out.clear();
        // SAFETY: each element is read in place (a pointer into the array, index within its size, valid while
        // `a` holds the array), never copied or kept; the array is released.
        unsafe {
            let mut a = self.variant_as_array()(v);
            let n = self.array_size()(&a).max(0);
            out.reserve(n as usize);
            let mut result = Ok(());
            // Read in place where the probe found Godot 3's layout, and this array's last element is where the
            // 24-byte stride from its first says (one contiguous vector): no API call per element.
            if self.ints_in_place && n > 0 {
                let first = self.array_operator_index_const()(&a, 0);
                let last = self.array_operator_index_const()(&a, n - 1);
                if !first.is_null() && last == first.wrapping_add(n as usize - 1) {
                    for i in 0..n as usize {
                        let e = first.add(i);
                        let t = type_in_place(e);
                        if t != variant_type::INT {
                            result = Err((i, t));
                            break;
                        }
                        out.push(int_in_place(e));
                    }
                    self.array_destroy()(&mut a);
                    return result;
                }
            }
            // Otherwise element by element, in place rather than `array_get` (a copy of each element, then its
            // destroy): two calls per agent fewer, measured ~1.5 µs of a 100-agent tick.
            for i in 0..n {
                let e = self.array_operator_index_const()(&a, i);
                let t = self.variant_get_type()(e);
                if t != variant_type::INT {
                    result = Err((i as usize, t));
                    break;
                }
                out.push(self.variant_as_int()(e));
            }
            self.array_destroy()(&mut a);
            result
        }
    }

    pub fn nil(&self) -> Variant {
        let mut v = Variant::uninit();
        // SAFETY: `v` is storage for a variant.
        unsafe { self.variant_new_nil()(&mut v) };
        v
    }

    pub fn bool_variant(&self, b: bool) -> Variant {
        let mut v = Variant::uninit();
        // SAFETY: as `nil`.
        unsafe { self.variant_new_bool()(&mut v, b) };
        v
    }

    pub fn int_variant(&self, i: i64) -> Variant {
        let mut v = Variant::uninit();
        // SAFETY: as `nil`.
        unsafe { self.variant_new_int()(&mut v, i) };
        v
    }

    pub fn real_variant(&self, x: f64) -> Variant {
        let mut v = Variant::uninit();
        // SAFETY: as `nil`.
        unsafe { self.variant_new_real()(&mut v, x) };
        v
    }

    pub fn string_variant(&self, s: &str) -> Variant {
        let mut v = Variant::uninit();
        let mut g = self.string(s);
        // SAFETY: the variant takes its own reference to the String, which is then released.
        unsafe {
            self.variant_new_string()(&mut v, &g);
            self.string_destroy()(&mut g);
        }
        v
    }

    pub fn real_array_variant(&self, xs: &[f32]) -> Variant {
        let mut v = Variant::uninit();
        let mut a = self.pool_real_array(xs);
        // SAFETY: the variant takes its own reference to the array, which is then released.
        unsafe {
            self.variant_new_pool_real_array()(&mut v, &a);
            self.pool_real_array_destroy()(&mut a);
        }
        v
    }

    /// A Dictionary variant of `entries` (string keys).
    pub fn dictionary_variant(&self, entries: Vec<(&str, Variant)>) -> Variant {
        let mut d = Dictionary::uninit();
        let mut v = Variant::uninit();
        // SAFETY: keys and values are copied into the dictionary, then destroyed; the variant takes its own
        // reference to the dictionary, which is then released.
        unsafe {
            self.dictionary_new()(&mut d);
            for (k, mut value) in entries {
                let mut key = self.string_variant(k);
                self.dictionary_set()(&mut d, &key, &value);
                self.variant_destroy()(&mut key);
                self.variant_destroy()(&mut value);
            }
            self.variant_new_dictionary()(&mut v, &d);
            self.dictionary_destroy()(&mut d);
        }
        v
    }
}
