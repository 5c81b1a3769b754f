// policyport for C# (Unity, Godot .NET, plain .NET / Mono): P/Invoke over the C ABI (libpolicyport_capi, ABI 6).
//
// Handles are SafeHandles (freed exactly once, also by the finalizer); spans go in and out without copies; every
// non-OK status of the library becomes a typed exception carrying pp_last_error()'s message. C# 7.2 (what Mono's
// mcs and Unity compile); no dependency beyond the base library.
//
//     using (var agents = Policyport.Agents.Load(File.ReadAllBytes("cartpole.policy"), seed: 7))
//     {
//         ulong id = agents.Spawn();
//         agents.Tick(ids, observations, actions, values);   // one batched act() for every agent, each frame
//     }
using System;
using System.Runtime.InteropServices;

namespace Policyport
{
    /// <summary>The C ABI's status codes (PpStatus).</summary>
    public enum Status
    {
        Ok = 0,
        InvalidArtifact = 1,
        BadObservation = 2,
        BadCall = 3,
        State = 4,
        Backend = 5,
        NullPointer = 6,
        Panic = 7,
        Sandbox = 8,
        Io = 9,
        TooLarge = 10,
        NonFiniteOutput = 11,
    }

    /// <summary>Native backends (PpBackend).</summary>
    public enum Backend : uint
    {
        Cpu = 0,
        Flex = 1,
        CpuBf16 = 2,
    }

    /// <summary>How act() uses a policy's threads (<see cref="Policy.SetThreadSplit"/>).</summary>
    public enum ThreadSplit : uint
    {
        /// <summary>Split a batch only while that measures faster than the calling thread alone (the default):
        /// threads never slow act() down when the game's own threads take the cores.</summary>
        Measured = 0,
        /// <summary>Split every batch of at least 8 rows per thread (benchmarks and tests of the split).</summary>
        Always = 1,
    }

    /// <summary>A call the library refused; <see cref="Status"/> says which kind, the message why. Nothing
    /// changed.</summary>
    public class PolicyportException : Exception
    {
        public Status Status { get; }

        public PolicyportException(Status status, string message) : base(message) { Status = status; }

        internal static PolicyportException Of(Status status, string message)
        {
            switch (status)
            {
                case Status.InvalidArtifact: return new InvalidArtifactException(message);
                case Status.BadObservation: return new ObservationException(message);
                case Status.BadCall:
                case Status.NullPointer: return new BadCallException(status, message);
                case Status.Sandbox: return new SandboxException(message);
                case Status.TooLarge: return new TooLargeException(message);
                case Status.NonFiniteOutput: return new NonFiniteOutputException(message);
                default: return new PolicyportException(status, message);
            }
        }
    }

    /// <summary>The artifact was refused (corrupt, truncated, a newer format, invalid).</summary>
    public sealed class InvalidArtifactException : PolicyportException
    {
        public InvalidArtifactException(string m) : base(Status.InvalidArtifact, m) { }
    }

    /// <summary>Observations the policy cannot take (length, non-finite values).</summary>
    public sealed class ObservationException : PolicyportException
    {
        public ObservationException(string m) : base(Status.BadObservation, m) { }
    }

    /// <summary>A call that does not fit (a stale agent id, a mask of the wrong length, ...).</summary>
    public sealed class BadCallException : PolicyportException
    {
        public BadCallException(Status s, string m) : base(s, m) { }
    }

    /// <summary>The wasm sandbox failed (deadline, memory cap, trap).</summary>
    public sealed class SandboxException : PolicyportException
    {
        public SandboxException(string m) : base(Status.Sandbox, m) { }
    }

    /// <summary>Over the policy's memory budget or the agents limit.</summary>
    public sealed class TooLargeException : PolicyportException
    {
        public TooLargeException(string m) : base(Status.TooLarge, m) { }
    }

    /// <summary>The policy computed NaN or infinity.</summary>
    public sealed class NonFiniteOutputException : PolicyportException
    {
        public NonFiniteOutputException(string m) : base(Status.NonFiniteOutput, m) { }
    }

    [StructLayout(LayoutKind.Sequential)]
    public struct PolicyInfo
    {
        public uint ObsLen;
        public uint ActionLen;
        public uint DistParamsLen;
        public uint HasValue;
        public uint Discrete;
        public uint Sandboxed;
    }

    [StructLayout(LayoutKind.Sequential)]
    public struct AgentsInfo
    {
        public uint ObsLen;
        public uint ActionLen;
        public uint MaskLen;
        public uint Discrete;
        public uint Alive;
        public ulong Tick;
    }

    internal static class Native
    {
        // Mono and .NET map this to libpolicyport_capi.so / policyport_capi.dll / libpolicyport_capi.dylib.
        const string Lib = "policyport_capi";

        [DllImport(Lib)] internal static extern uint pp_abi_version();
        [DllImport(Lib)] internal static extern IntPtr pp_last_error();
        [DllImport(Lib)] internal static extern unsafe Status pp_policy_load(byte* bytes, UIntPtr len, uint backend, out PolicyHandle policy);
        [DllImport(Lib)] internal static extern unsafe Status pp_policy_load_wasm(byte* bytes, UIntPtr len, [MarshalAs(UnmanagedType.LPStr)] string pluginPath, UIntPtr memoryBytes, uint deadlineMs, out PolicyHandle policy);
        [DllImport(Lib)] internal static extern Status pp_policy_info(PolicyHandle policy, out PolicyInfo info);
        [DllImport(Lib)] internal static extern unsafe Status pp_policy_act_ids(PolicyHandle policy, float* obs, UIntPtr batch, uint* envIds, int sample, ulong seed, ulong step, long* discrete, float* continuous, float* value, float* distParams, byte* episodeStarts, byte* actionMask, float epsilon);
        [DllImport(Lib)] internal static extern unsafe Status pp_policy_reset(PolicyHandle policy, uint* envs, UIntPtr n);
        [DllImport(Lib)] internal static extern Status pp_policy_set_threads(PolicyHandle policy, UIntPtr threads);
        [DllImport(Lib)] internal static extern Status pp_policy_set_thread_split(PolicyHandle policy, uint split);
        [DllImport(Lib)] internal static extern void pp_policy_free(IntPtr policy);
        [DllImport(Lib)] internal static extern Status pp_agents_new(IntPtr policy, ulong seed, int sample, UIntPtr maxAgents, out AgentsHandle agents);
        [DllImport(Lib)] internal static extern Status pp_agents_spawn(AgentsHandle agents, out ulong id);
        [DllImport(Lib)] internal static extern Status pp_agents_despawn(AgentsHandle agents, ulong id);
        [DllImport(Lib)] internal static extern Status pp_agents_respawn(AgentsHandle agents, ulong id);
        [DllImport(Lib)] internal static extern unsafe Status pp_agents_observe(AgentsHandle agents, ulong id, float* obs, UIntPtr obsLen, byte* mask, UIntPtr maskLen);
        [DllImport(Lib)] internal static extern Status pp_agents_act(AgentsHandle agents, out UIntPtr acted);
        [DllImport(Lib)] internal static extern unsafe Status pp_agents_action(AgentsHandle agents, ulong id, long* discrete, float* continuous, float* value);
        [DllImport(Lib)] internal static extern unsafe Status pp_agents_tick(AgentsHandle agents, ulong* ids, UIntPtr n, float* obs, byte* mask, long* discrete, float* continuous, float* value);
        [DllImport(Lib)] internal static extern Status pp_agents_info(AgentsHandle agents, out AgentsInfo info);
        [DllImport(Lib)] internal static extern Status pp_agents_set_sampling(AgentsHandle agents, int sample);
        [DllImport(Lib)] internal static extern void pp_agents_free(IntPtr agents);

        internal static void Check(Status s)
        {
            if (s != Status.Ok)
            {
                string m = Marshal.PtrToStringAnsi(pp_last_error()) ?? "";
                throw PolicyportException.Of(s, m);
            }
        }

        /// <summary>The ABI this binding speaks.</summary>
        internal const uint AbiVersion = 7;

        internal static void CheckAbi()
        {
            uint v = pp_abi_version();
            if (v != AbiVersion)
                throw new PolicyportException(Status.BadCall, "libpolicyport_capi speaks ABI " + v + ", this binding " + AbiVersion);
        }
    }

    /// <summary>A PpPolicy*: freed once, by Dispose or the finalizer.</summary>
    public sealed class PolicyHandle : SafeHandle
    {
        public PolicyHandle() : base(IntPtr.Zero, true) { }
        public override bool IsInvalid => handle == IntPtr.Zero;
        protected override bool ReleaseHandle() { Native.pp_policy_free(handle); return true; }
        /// <summary>Hand the pointer to a call that consumes it (pp_agents_new).</summary>
        internal IntPtr Release() { IntPtr h = handle; SetHandleAsInvalid(); return h; }
    }

    /// <summary>A PpAgents*: freed once, by Dispose or the finalizer.</summary>
    public sealed class AgentsHandle : SafeHandle
    {
        public AgentsHandle() : base(IntPtr.Zero, true) { }
        public override bool IsInvalid => handle == IntPtr.Zero;
        protected override bool ReleaseHandle() { Native.pp_agents_free(handle); return true; }
    }

    /// <summary>A loaded policy: act on a batch of rows, each row naming its env id. One thread at a time.</summary>
    public sealed class Policy : IDisposable
    {
        internal PolicyHandle Handle;
        public PolicyInfo Info { get; }

        Policy(PolicyHandle h)
        {
            Handle = h;
            Native.Check(Native.pp_policy_info(h, out PolicyInfo info));
            Info = info;
        }

        /// <summary>Load an artifact natively.</summary>
        public static unsafe Policy Load(byte[] artifact, Backend backend = Backend.Cpu)
        {
            if (artifact == null) throw new ArgumentNullException(nameof(artifact));
            Native.CheckAbi();
            PolicyHandle h;
            fixed (byte* p = artifact)
                Native.Check(Native.pp_policy_load(p, (UIntPtr)artifact.Length, (uint)backend, out h));
            return new Policy(h);
        }

        /// <summary>Load an artifact inside the wasm sandbox (policyport_plugin.wasm at <paramref name="pluginPath"/>):
        /// memory cap and per-call deadline (0 for the defaults, 256 MiB and 1000 ms).</summary>
        public static unsafe Policy LoadSandboxed(byte[] artifact, string pluginPath, ulong memoryBytes = 0, uint deadlineMs = 0)
        {
            if (artifact == null) throw new ArgumentNullException(nameof(artifact));
            if (pluginPath == null) throw new ArgumentNullException(nameof(pluginPath));
            Native.CheckAbi();
            PolicyHandle h;
            fixed (byte* p = artifact)
                Native.Check(Native.pp_policy_load_wasm(p, (UIntPtr)artifact.Length, pluginPath, (UIntPtr)memoryBytes, deadlineMs, out h));
            return new Policy(h);
        }

        /// <summary>One act() for <c>envIds.Length</c> rows: <paramref name="obs"/> holds one observation per row,
        /// row i naming env id <c>envIds[i]</c> (its sampling stream and recurrent state). Sampled with (seed, env
        /// id, step) unless <paramref name="sample"/> is false. Outputs may be empty to skip them; otherwise
        /// rows × action_len actions, rows values.</summary>
        public unsafe void Act(ReadOnlySpan<float> obs, ReadOnlySpan<uint> envIds, bool sample, ulong seed, ulong step,
            Span<long> discreteActions, Span<float> continuousActions, Span<float> values,
            ReadOnlySpan<byte> episodeStarts = default(ReadOnlySpan<byte>))
        {
            int rows = envIds.Length;
            if (rows == 0) throw new ArgumentException("no rows", nameof(envIds));
            if (obs.Length != rows * (int)Info.ObsLen)
                throw new ArgumentException("obs holds " + obs.Length + " floats; " + rows + " rows need " + rows * Info.ObsLen, nameof(obs));
            int k = rows * (int)Info.ActionLen;
            if (!discreteActions.IsEmpty && (Info.Discrete == 0 || discreteActions.Length < k))
                throw new ArgumentException("discreteActions needs " + k + " entries of a discrete policy", nameof(discreteActions));
            if (!continuousActions.IsEmpty && (Info.Discrete != 0 || continuousActions.Length < k))
                throw new ArgumentException("continuousActions needs " + k + " entries of a continuous policy", nameof(continuousActions));
            if (!values.IsEmpty && (Info.HasValue == 0 || values.Length < rows))
                throw new ArgumentException("values needs " + rows + " entries of a policy with a value", nameof(values));
            if (!episodeStarts.IsEmpty && episodeStarts.Length != rows)
                throw new ArgumentException("episodeStarts needs one byte per row", nameof(episodeStarts));
            fixed (float* o = &MemoryMarshal.GetReference(obs))
            fixed (uint* ids = &MemoryMarshal.GetReference(envIds))
            fixed (long* d = &MemoryMarshal.GetReference(discreteActions))
            fixed (float* c = &MemoryMarshal.GetReference(continuousActions))
            fixed (float* v = &MemoryMarshal.GetReference(values))
            fixed (byte* s = &MemoryMarshal.GetReference(episodeStarts))
            {
                Native.Check(Native.pp_policy_act_ids(Handle, o, (UIntPtr)rows, ids, sample ? 1 : 0, seed, step,
                    discreteActions.IsEmpty ? null : d, continuousActions.IsEmpty ? null : c, values.IsEmpty ? null : v,
                    null, episodeStarts.IsEmpty ? null : s, null, float.NaN));
            }
        }

        /// <summary>Split each act() over <paramref name="threads"/> threads by rows (the calling thread and
        /// threads - 1 workers the policy owns; 0: one per core; 1: the default). The native cpu backend only
        /// (a <c>PolicyportException</c> with <c>Status.Backend</c> elsewhere); the same actions whatever the count.
        /// Agents made from this policy keep it: call it before <c>Agents.FromPolicy</c>.</summary>
        public void SetThreads(int threads)
        {
            if (threads < 0) throw new ArgumentOutOfRangeException(nameof(threads));
            Native.Check(Native.pp_policy_set_threads(Handle, (UIntPtr)threads));
        }

        /// <summary>How act() uses the threads <see cref="SetThreads"/> gave: <see cref="ThreadSplit.Measured"/>
        /// (the default) or <see cref="ThreadSplit.Always"/>; the same actions either way. Another value is a
        /// <c>BadCallException</c>.</summary>
        public void SetThreadSplit(ThreadSplit split)
        {
            Native.Check(Native.pp_policy_set_thread_split(Handle, (uint)split));
        }

        public void Dispose() { Handle.Dispose(); }
    }

    /// <summary>Agents acting through one policy: agents by stable id, one batched act() per tick, recurrent
    /// memory per agent, a new episode at every (re)spawn. One thread at a time.</summary>
    public sealed class Agents : IDisposable
    {
        readonly AgentsHandle handle;
        public AgentsInfo Info { get { Native.Check(Native.pp_agents_info(handle, out AgentsInfo i)); return i; } }
        readonly int obsLen, actionLen, maskLen;
        readonly bool discrete;

        Agents(AgentsHandle h)
        {
            handle = h;
            AgentsInfo i = Info;
            obsLen = (int)i.ObsLen; actionLen = (int)i.ActionLen; maskLen = (int)i.MaskLen; discrete = i.Discrete != 0;
        }

        /// <summary>Agents on <paramref name="policy"/>, which they take over (the policy is disposed).</summary>
        public static Agents FromPolicy(Policy policy, ulong seed, bool sample = true, int maxAgents = 0)
        {
            if (policy == null) throw new ArgumentNullException(nameof(policy));
            IntPtr raw = policy.Handle.Release();
            Status s = Native.pp_agents_new(raw, seed, sample ? 1 : 0, (UIntPtr)maxAgents, out AgentsHandle h);
            if (s != Status.Ok)
            {
                Native.pp_policy_free(raw); // not consumed on error: free it here, the Policy no longer owns it
                Native.Check(s);
            }
            return new Agents(h);
        }

        /// <summary>Agents on an artifact loaded natively.</summary>
        public static Agents Load(byte[] artifact, ulong seed, bool sample = true, Backend backend = Backend.Cpu)
        {
            return FromPolicy(Policy.Load(artifact, backend), seed, sample);
        }

        public int ObsLen => obsLen;
        public int ActionLen => actionLen;
        public int MaskLen => maskLen;

        /// <summary>A new agent; its first act starts a new episode.</summary>
        public ulong Spawn() { Native.Check(Native.pp_agents_spawn(handle, out ulong id)); return id; }

        /// <summary>The agent is gone; its id is dead from now on.</summary>
        public void Despawn(ulong id) { Native.Check(Native.pp_agents_despawn(handle, id)); }

        /// <summary>The same agent starts a new episode at its next act.</summary>
        public void Respawn(ulong id) { Native.Check(Native.pp_agents_respawn(handle, id)); }

        public void SetSampling(bool sample) { Native.Check(Native.pp_agents_set_sampling(handle, sample ? 1 : 0)); }

        /// <summary>A whole tick: each agent of <paramref name="ids"/> with its observation (row i of
        /// <paramref name="obs"/>) and optional mask (row i of <paramref name="masks"/>: MaskLen bytes, non-zero
        /// allowing the action), one act, each agent's actions and value written in the same order.</summary>
        public unsafe void Tick(ReadOnlySpan<ulong> ids, ReadOnlySpan<float> obs, Span<long> discreteActions,
            Span<float> continuousActions, Span<float> values, ReadOnlySpan<byte> masks = default(ReadOnlySpan<byte>))
        {
            int n = ids.Length;
            if (obs.Length != n * obsLen)
                throw new ArgumentException("obs holds " + obs.Length + " floats; " + n + " agents need " + n * obsLen, nameof(obs));
            if (!discreteActions.IsEmpty && (!discrete || discreteActions.Length < n * actionLen))
                throw new ArgumentException("discreteActions needs " + n * actionLen + " entries of a discrete policy", nameof(discreteActions));
            if (!continuousActions.IsEmpty && (discrete || continuousActions.Length < n * actionLen))
                throw new ArgumentException("continuousActions needs " + n * actionLen + " entries of a continuous policy", nameof(continuousActions));
            if (!values.IsEmpty && values.Length < n)
                throw new ArgumentException("values needs " + n + " entries", nameof(values));
            if (!masks.IsEmpty && masks.Length != n * maskLen)
                throw new ArgumentException("masks needs " + n * maskLen + " bytes", nameof(masks));
            fixed (ulong* i = &MemoryMarshal.GetReference(ids))
            fixed (float* o = &MemoryMarshal.GetReference(obs))
            fixed (byte* m = &MemoryMarshal.GetReference(masks))
            fixed (long* d = &MemoryMarshal.GetReference(discreteActions))
            fixed (float* c = &MemoryMarshal.GetReference(continuousActions))
            fixed (float* v = &MemoryMarshal.GetReference(values))
            {
                Native.Check(Native.pp_agents_tick(handle, n == 0 ? null : i, (UIntPtr)n, n == 0 ? null : o,
                    masks.IsEmpty ? null : m, discreteActions.IsEmpty ? null : d,
                    continuousActions.IsEmpty ? null : c, values.IsEmpty ? null : v));
            }
        }

        /// <summary>Stage one agent's observation (and mask) for the next <see cref="Act"/>.</summary>
        public unsafe void Observe(ulong id, ReadOnlySpan<float> obs, ReadOnlySpan<byte> mask = default(ReadOnlySpan<byte>))
        {
            fixed (float* o = &MemoryMarshal.GetReference(obs))
            fixed (byte* m = &MemoryMarshal.GetReference(mask))
                Native.Check(Native.pp_agents_observe(handle, id, o, (UIntPtr)obs.Length, mask.IsEmpty ? null : m, (UIntPtr)mask.Length));
        }

        /// <summary>One act for every agent observed since the last; returns how many acted.</summary>
        public int Act() { Native.Check(Native.pp_agents_act(handle, out UIntPtr n)); return (int)n; }

        /// <summary>An agent's discrete actions from the last act (ActionLen of them).</summary>
        public unsafe void Action(ulong id, Span<long> discreteActions)
        {
            if (discreteActions.Length < actionLen) throw new ArgumentException("needs " + actionLen + " entries", nameof(discreteActions));
            fixed (long* d = &MemoryMarshal.GetReference(discreteActions))
                Native.Check(Native.pp_agents_action(handle, id, d, null, null));
        }

        public void Dispose() { handle.Dispose(); }
    }
}
