//! External environments: an [`Environment`] played by a separate program that speaks the
//! environment protocol ([`PROTOCOL`], JSON lines on its stdin/stdout; `docs/environments.md`,
//! "External environments").
//!
//! The node owns everything around the program: a timeout on every call, a memory limit
//! (`prlimit --as`), no network (`unshare -rn`) where the platform allows it, a bound on every
//! line it writes, and the restart of a program that crashed, hung or answered garbage — the
//! episode it was playing is abandoned with a typed [`ExternalError`], never given a reward.
//! A reply is accepted only when it is well-formed JSON of the expected shape with finite
//! rewards and, at the end of an episode, a return inside the declared range.
//!
//! One process plays one episode at a time; idle processes wait in a pool for the next
//! [`Environment::reset`]. [`start`] refuses a program whose episodes differ between two
//! fresh processes under the same seed and actions (it cannot be replayed).
//!
//! Owns: the protocol, the process pool, the launch wrapper, the pin. Must not touch:
//! models, tokenizers, storage, networking.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::env::{EnvMetadata, Environment, Episode, Start, Step};
use crate::{Prompt, TaskError};

/// Version of the environment protocol this node speaks.
pub const PROTOCOL: u32 = 1;
/// Most agent turns a program may declare.
pub const MAX_TURNS: u32 = 4096;
/// Largest absolute reward of one step (a sum of such stays exact enough in f32).
pub const MAX_ABS_REWARD: f32 = 1e6;
/// Most bytes of an error message or stderr line kept from a program.
const MAX_NOTE: usize = 512;
/// Stderr lines of a program kept for its crash report.
const STDERR_TAIL: usize = 8;

/// `[task.external]`: how to run an external environment and the limits it runs under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExternalSpec {
    /// The program and its arguments, e.g. `["python3", "envs/testenv.py"]`. Local: paths
    /// may differ between hosts; what runs is pinned by [`Self::pin_files`] and `version`.
    pub command: Vec<String>,
    /// Files whose contents enter the pin (besides every argument of `command` that names an
    /// existing file, which always does).
    pub pin_files: Vec<PathBuf>,
    /// The version the program must report in its `hello` (e.g. `"reasoning-gym 0.1.25"`);
    /// part of the pin. Unset: any version, and the pin covers the files only.
    pub version: Option<String>,
    /// Most milliseconds one `reset`, `step`, `truncate` or `reference` call may take.
    pub call_timeout_ms: u64,
    /// Most milliseconds a fresh process may take to answer `hello` (imports included).
    pub start_timeout_ms: u64,
    /// Address-space limit of the process in MiB (`RLIMIT_AS` via `prlimit`); 0 = none.
    pub memory_mib: u64,
    /// Longest line the program may write, in bytes; a longer one is an error.
    pub max_line_bytes: usize,
    /// Let the program reach the network (default: no; run in a fresh network namespace).
    pub network: bool,
    /// Idle processes kept for the next episodes.
    pub pool: usize,
    /// Seeds replayed twice, in fresh processes, at start to check determinism (0 = skip).
    pub determinism_seeds: u32,
}

impl Default for ExternalSpec {
    fn default() -> Self {
        ExternalSpec {
            command: Vec::new(),
            pin_files: Vec::new(),
            version: None,
            call_timeout_ms: 10_000,
            start_timeout_ms: 60_000,
            memory_mib: 4096,
            max_line_bytes: 1 << 20,
            network: false,
            pool: 4,
            determinism_seeds: 3,
        }
    }
}

impl ExternalSpec {
    /// Problems with the values (all at once), each as (key, problem).
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut bad = |k: &str, p: &str| out.push((k.to_string(), p.to_string()));
        if self.command.is_empty() || self.command[0].is_empty() {
            bad("command", "names no program");
        }
        if !(1..=3_600_000).contains(&self.call_timeout_ms) {
            bad("call_timeout_ms", "must be in 1..=3600000");
        }
        if !(1..=3_600_000).contains(&self.start_timeout_ms) {
            bad("start_timeout_ms", "must be in 1..=3600000");
        }
        if !(1024..=(64 << 20)).contains(&self.max_line_bytes) {
            bad("max_line_bytes", "must be in 1024..=67108864");
        }
        if self.memory_mib != 0 && self.memory_mib < 64 {
            bad("memory_mib", "must be 0 (no limit) or at least 64");
        }
        if self.pool > 256 {
            bad("pool", "must be at most 256");
        }
        if self.determinism_seeds > 64 {
            bad("determinism_seeds", "must be at most 64");
        }
        out
    }

    /// The files the pin covers: `pin_files`, then every argument naming an existing file.
    fn pinned_files(&self) -> Vec<PathBuf> {
        let mut files = self.pin_files.clone();
        for a in self.command.iter().skip(1) {
            let p = PathBuf::from(a);
            if p.is_file() && !files.contains(&p) {
                files.push(p);
            }
        }
        files
    }
}

/// What went wrong with an external environment. Never a reward: the episode is abandoned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExternalError {
    /// The program could not be started.
    #[error("cannot start {program:?}: {reason}")]
    Spawn { program: String, reason: String },
    /// A pinned file could not be read.
    #[error("cannot read pinned file {path}: {reason}")]
    PinFile { path: String, reason: String },
    /// No answer within the call's timeout; the process was killed.
    #[error("{op}: no answer within {ms} ms (killed)")]
    Timeout { op: &'static str, ms: u64 },
    /// The process exited or closed its output.
    #[error("{op}: the program exited ({status}); stderr: {stderr}")]
    Exited {
        op: &'static str,
        status: String,
        stderr: String,
    },
    /// A line longer than the bound.
    #[error("{op}: a line longer than {limit} bytes")]
    LineTooLong { op: &'static str, limit: usize },
    /// A line that is not a JSON object.
    #[error("{op}: not a JSON object: {detail}")]
    BadJson { op: &'static str, detail: String },
    /// A JSON reply of the wrong shape, or values out of bounds.
    #[error("{op}: {detail}")]
    Protocol { op: &'static str, detail: String },
    /// The program answered `{"ok": false, "error": …}`.
    #[error("{op}: the program refused: {error}")]
    Refused { op: &'static str, error: String },
    /// A reward that is not a finite number within ±[`MAX_ABS_REWARD`].
    #[error("{op}: reward {value} is not a finite number within ±{MAX_ABS_REWARD}")]
    BadReward { op: &'static str, value: String },
    /// An episode's return outside the declared range.
    #[error("return {ret} is outside the declared range [{lo}, {hi}]")]
    ReturnOutOfRange { ret: f32, lo: f32, hi: f32 },
    /// A call on an episode that ended or was abandoned.
    #[error("the program went on past the end of the episode ({detail})")]
    PastEnd { detail: String },
    /// The program reports another version than the configured one.
    #[error("the program reports version {reported:?}, the swarm pins {declared:?}")]
    Version { declared: String, reported: String },
    /// A fresh process answered `hello` with other metadata than the first one.
    #[error("a fresh process reports other metadata than the first")]
    MetadataChanged,
    /// Two replays of the same seed and actions differ.
    #[error(
        "not deterministic: seed {seed} replayed in two fresh processes differs ({detail}); \
         an environment must derive all randomness from the seed"
    )]
    NonDeterministic { seed: u64, detail: String },
}

/// The operation of a call (for errors and logs).
#[derive(Debug, Clone, Copy)]
enum Op {
    Hello,
    Reset,
    Step,
    Truncate,
    Reference,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Hello => "hello",
            Op::Reset => "reset",
            Op::Step => "step",
            Op::Truncate => "truncate",
            Op::Reference => "reference",
        }
    }
}

/// Requests, one JSON object per line.
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Request<'a> {
    Hello {
        protocol: u32,
        name: &'a str,
        params: &'a serde_json::Value,
    },
    Reset {
        seed: u64,
    },
    Step {
        action: &'a str,
    },
    Truncate,
    Reference {
        seed: u64,
    },
}

/// The reply to `hello`: what the environment is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub num_initial_states: Option<u64>,
    pub max_turns: u32,
    pub return_range: (f32, f32),
    pub suggested_tokens_per_turn: usize,
    /// The longest observation in tokens, for the default episode budget (64 when absent).
    #[serde(default)]
    pub max_observation_tokens: Option<usize>,
    #[serde(default)]
    pub system_prompt: Option<String>,
}

impl Hello {
    fn check(&self) -> Result<(), String> {
        if self.protocol != PROTOCOL {
            return Err(format!(
                "protocol {}, this node speaks {PROTOCOL}",
                self.protocol
            ));
        }
        if !(1..=MAX_TURNS).contains(&self.max_turns) {
            return Err(format!(
                "max_turns {} is outside 1..={MAX_TURNS}",
                self.max_turns
            ));
        }
        let (lo, hi) = self.return_range;
        if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
            return Err(format!(
                "return_range [{lo}, {hi}] is not a finite interval"
            ));
        }
        if !(1..=65_536).contains(&self.suggested_tokens_per_turn) {
            return Err("suggested_tokens_per_turn is outside 1..=65536".into());
        }
        if self.num_initial_states == Some(0) {
            return Err("num_initial_states is 0".into());
        }
        if self
            .max_observation_tokens
            .is_some_and(|n| !(1..=65_536).contains(&n))
        {
            return Err("max_observation_tokens is outside 1..=65536".into());
        }
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
struct ResetReply {
    observation: String,
}

#[derive(Debug, Deserialize)]
struct StepReply {
    reward: f64,
    done: bool,
    #[serde(default)]
    observation: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RewardReply {
    #[serde(default)]
    reward: f64,
}

#[derive(Debug, Deserialize)]
struct ReferenceReply {
    #[serde(default)]
    action: Option<String>,
}

fn note(s: &str) -> String {
    if s.len() <= MAX_NOTE {
        return s.to_string();
    }
    let mut end = MAX_NOTE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// One line read from the program's stdout.
enum Out {
    Line(Vec<u8>),
    TooLong,
    Eof,
}

/// Reads one line of at most `max` bytes (the newline excluded); `Ok(None)` at the end.
fn read_bounded(r: &mut impl BufRead, max: usize) -> std::io::Result<Option<Result<Vec<u8>, ()>>> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(Ok(line)));
        }
        let (take, end) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + take > max {
            return Ok(Some(Err(())));
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(if end { take + 1 } else { take });
        if end {
            return Ok(Some(Ok(line)));
        }
    }
}

/// How processes are started: the wrapper (network namespace, memory limit) and the program.
#[derive(Debug, Clone)]
struct Launch {
    argv: Vec<String>,
    max_line: usize,
    name: String,
}

/// Whether `unshare -rn` can make a network namespace here (checked once).
fn unshare_works() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        Command::new("unshare")
            .args(["-rn", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn prlimit_works() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        Command::new("prlimit")
            .args(["--as=1073741824", "--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Whether `program` names a file, or one on `PATH` for a bare name.
fn program_exists(program: &str) -> bool {
    if program.contains('/') {
        return std::path::Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

/// How the sandbox of a program looks on this host (for logs and docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sandbox {
    /// Runs in a network namespace of its own (no network).
    pub no_network: bool,
    /// Runs under an address-space limit.
    pub memory_limit: bool,
}

impl Launch {
    fn new(name: &str, spec: &ExternalSpec) -> (Launch, Sandbox) {
        let mut argv = Vec::new();
        let mut sandbox = Sandbox {
            no_network: false,
            memory_limit: false,
        };
        if !spec.network {
            if unshare_works() {
                argv.extend(["unshare".to_string(), "-rn".to_string()]);
                sandbox.no_network = true;
            } else {
                tracing::warn!(
                    env = name,
                    "unshare -rn is not available here: the environment runs with network access"
                );
            }
        }
        if spec.memory_mib > 0 {
            if prlimit_works() {
                argv.push("prlimit".into());
                argv.push(format!("--as={}", spec.memory_mib << 20));
                argv.push("--".into());
                sandbox.memory_limit = true;
            } else {
                tracing::warn!(
                    env = name,
                    "prlimit is not available here: the environment runs without a memory limit"
                );
            }
        }
        argv.extend(spec.command.iter().cloned());
        (
            Launch {
                argv,
                max_line: spec.max_line_bytes,
                name: name.to_string(),
            },
            sandbox,
        )
    }
}

/// One running program.
struct Proc {
    child: Child,
    requests: Option<SyncSender<Vec<u8>>>,
    replies: Receiver<Out>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    max_line: usize,
}

impl Proc {
    fn spawn(launch: &Launch) -> Result<Proc, ExternalError> {
        let program = launch.argv[0].clone();
        let mut child = Command::new(&program)
            .args(&launch.argv[1..])
            .env("PYTHONHASHSEED", "0")
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ExternalError::Spawn {
                program: program.clone(),
                reason: e.to_string(),
            })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ExternalError::Spawn {
                program,
                reason: "no pipes".into(),
            });
        };
        let (req_tx, req_rx) = mpsc::sync_channel::<Vec<u8>>(1);
        let (out_tx, out_rx) = mpsc::sync_channel::<Out>(1);
        spawn_writer(stdin, req_rx);
        let max = launch.max_line;
        std::thread::spawn(move || {
            let mut r = BufReader::with_capacity(64 << 10, stdout);
            loop {
                let out = match read_bounded(&mut r, max) {
                    Ok(Some(Ok(line))) => Out::Line(line),
                    Ok(Some(Err(()))) => Out::TooLong,
                    Ok(None) | Err(_) => Out::Eof,
                };
                let stop = !matches!(out, Out::Line(_));
                if out_tx.send(out).is_err() || stop {
                    return;
                }
            }
        });
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let (t, name, pid) = (tail.clone(), launch.name.clone(), child.id());
        std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            while let Ok(Some(line)) = read_bounded(&mut r, 1 << 16) {
                let line = match line {
                    Ok(l) => note(String::from_utf8_lossy(&l).trim_end()),
                    Err(()) => "(a stderr line longer than 64 KiB)".to_string(),
                };
                tracing::debug!(env = %name, pid, "stderr: {line}");
                let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                if t.len() == STDERR_TAIL {
                    t.pop_front();
                }
                t.push_back(line);
            }
        });
        Ok(Proc {
            child,
            requests: Some(req_tx),
            replies: out_rx,
            stderr: tail,
            max_line: launch.max_line,
        })
    }

    fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_empty() {
            "(none)".into()
        } else {
            t.iter().cloned().collect::<Vec<_>>().join(" | ")
        }
    }

    /// Sends `req` and reads the reply object within `timeout`.
    fn call(
        &mut self,
        op: Op,
        req: &Request<'_>,
        timeout: Duration,
    ) -> Result<serde_json::Value, ExternalError> {
        let mut line = serde_json::to_vec(req).map_err(|e| ExternalError::Protocol {
            op: op.name(),
            detail: e.to_string(),
        })?;
        line.push(b'\n');
        // A line nobody asked for would be taken as the answer to this request.
        if let Ok(Out::Line(_) | Out::TooLong) = self.replies.try_recv() {
            return Err(ExternalError::Protocol {
                op: op.name(),
                detail: "the program wrote a line nobody asked for".into(),
            });
        }
        let sent = self
            .requests
            .as_ref()
            .is_some_and(|tx| tx.send(line).is_ok());
        let got = if sent {
            self.replies.recv_timeout(timeout)
        } else {
            Err(RecvTimeoutError::Disconnected)
        };
        match got {
            Ok(Out::Line(bytes)) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(|e| ExternalError::BadJson {
                        op: op.name(),
                        detail: note(&format!(
                            "{e}: {}",
                            String::from_utf8_lossy(&bytes[..bytes.len().min(120)])
                        )),
                    })?;
                let Some(obj) = v.as_object() else {
                    return Err(ExternalError::BadJson {
                        op: op.name(),
                        detail: "not an object".into(),
                    });
                };
                match obj.get("ok") {
                    Some(serde_json::Value::Bool(true)) => Ok(v),
                    Some(serde_json::Value::Bool(false)) => Err(ExternalError::Refused {
                        op: op.name(),
                        error: note(obj.get("error").and_then(|e| e.as_str()).unwrap_or("")),
                    }),
                    _ => Err(ExternalError::Protocol {
                        op: op.name(),
                        detail: "the reply has no boolean \"ok\"".into(),
                    }),
                }
            }
            Ok(Out::TooLong) => Err(ExternalError::LineTooLong {
                op: op.name(),
                limit: self.max_line,
            }),
            Ok(Out::Eof) | Err(RecvTimeoutError::Disconnected) => {
                // Give the exit a moment to be reaped, then report it.
                let status = (0..50)
                    .find_map(|_| match self.child.try_wait() {
                        Ok(Some(s)) => Some(s.to_string()),
                        Ok(None) => {
                            std::thread::sleep(Duration::from_millis(10));
                            None
                        }
                        Err(e) => Some(e.to_string()),
                    })
                    .unwrap_or_else(|| "closed its output".into());
                Err(ExternalError::Exited {
                    op: op.name(),
                    status,
                    stderr: self.stderr_tail(),
                })
            }
            Err(RecvTimeoutError::Timeout) => Err(ExternalError::Timeout {
                op: op.name(),
                ms: timeout.as_millis() as u64,
            }),
        }
    }
}

fn spawn_writer(mut stdin: ChildStdin, requests: Receiver<Vec<u8>>) {
    std::thread::spawn(move || {
        for line in requests {
            if stdin.write_all(&line).and_then(|()| stdin.flush()).is_err() {
                return;
            }
        }
    });
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.requests = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse<T: serde::de::DeserializeOwned>(op: Op, v: serde_json::Value) -> Result<T, ExternalError> {
    serde_json::from_value(v).map_err(|e| ExternalError::Protocol {
        op: op.name(),
        detail: note(&e.to_string()),
    })
}

fn check_reward(op: Op, r: f64) -> Result<f32, ExternalError> {
    let v = r as f32;
    if v.is_finite() && v.abs() <= MAX_ABS_REWARD {
        Ok(v)
    } else {
        Err(ExternalError::BadReward {
            op: op.name(),
            value: r.to_string(),
        })
    }
}

/// Counters of an external environment (for logs and the bench).
#[derive(Debug, Default)]
pub struct Counters {
    /// Processes started.
    pub spawned: AtomicU64,
    /// Processes killed after a failure (each one is restarted on the next episode).
    pub failures: AtomicU64,
    /// Calls answered.
    pub calls: AtomicU64,
}

struct Inner {
    name: String,
    params: serde_json::Value,
    spec: ExternalSpec,
    launch: Launch,
    hello: Hello,
    pin: [u8; 32],
    idle: Mutex<Vec<Proc>>,
    counters: Counters,
}

impl Inner {
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.spec.call_timeout_ms)
    }

    /// A process that has said hello with this environment's metadata.
    fn fresh(&self) -> Result<Proc, ExternalError> {
        let (p, hello) = open(&self.launch, &self.name, &self.params, &self.spec)?;
        self.counters.spawned.fetch_add(1, Ordering::Relaxed);
        if hello != self.hello {
            return Err(ExternalError::MetadataChanged);
        }
        Ok(p)
    }

    fn checkout(&self) -> Result<Proc, ExternalError> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(p) => Ok(p),
            None => self.fresh(),
        }
    }

    fn checkin(&self, p: Proc) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.spec.pool {
            idle.push(p);
        }
    }

    fn failed(&self, e: &ExternalError) {
        self.counters.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(env = %self.name, error = %e, "external environment failed: episode abandoned, process killed (a fresh one starts for the next episode)");
    }

    fn call(
        &self,
        p: &mut Proc,
        op: Op,
        req: &Request<'_>,
    ) -> Result<serde_json::Value, ExternalError> {
        let r = p.call(op, req, self.timeout());
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        r
    }

    fn reset(&self, p: &mut Proc, seed: u64) -> Result<String, ExternalError> {
        let v = self.call(p, Op::Reset, &Request::Reset { seed })?;
        Ok(parse::<ResetReply>(Op::Reset, v)?.observation)
    }
}

/// Starts a process and says hello.
fn open(
    launch: &Launch,
    name: &str,
    params: &serde_json::Value,
    spec: &ExternalSpec,
) -> Result<(Proc, Hello), ExternalError> {
    let mut p = Proc::spawn(launch)?;
    let v = p.call(
        Op::Hello,
        &Request::Hello {
            protocol: PROTOCOL,
            name,
            params,
        },
        Duration::from_millis(spec.start_timeout_ms),
    )?;
    let hello: Hello = parse(Op::Hello, v)?;
    hello.check().map_err(|detail| ExternalError::Protocol {
        op: "hello",
        detail,
    })?;
    if let Some(declared) = &spec.version {
        if hello.version.as_ref() != Some(declared) {
            return Err(ExternalError::Version {
                declared: declared.clone(),
                reported: hello.version.clone().unwrap_or_default(),
            });
        }
    }
    Ok((p, hello))
}

/// The pin of an external environment: what learner and workers must agree on — the
/// protocol version, the name, the parameters, the declared version and the contents of
/// the pinned files (not their paths, nor the interpreter's path, which differ by host).
pub fn pin(
    name: &str,
    params: &serde_json::Value,
    spec: &ExternalSpec,
) -> Result<[u8; 32], ExternalError> {
    let mut h = blake3::Hasher::new_derive_key("echo-swarm external environment pin v1");
    let field = |h: &mut blake3::Hasher, b: &[u8]| {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(&mut h, &PROTOCOL.to_le_bytes());
    field(&mut h, name.as_bytes());
    field(&mut h, params.to_string().as_bytes());
    field(&mut h, spec.version.as_deref().unwrap_or("").as_bytes());
    for path in spec.pinned_files() {
        let bytes = std::fs::read(&path).map_err(|e| ExternalError::PinFile {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        field(&mut h, blake3::hash(&bytes).as_bytes());
    }
    Ok(*h.finalize().as_bytes())
}

/// An environment behind a program speaking the protocol (see the module docs).
#[derive(Clone)]
pub struct ExternalEnv {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ExternalEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalEnv")
            .field("name", &self.inner.name)
            .field("pin", &hex_pin(&self.inner.pin))
            .finish()
    }
}

fn hex_pin(pin: &[u8; 32]) -> String {
    pin.iter().map(|b| format!("{b:02x}")).collect()
}

fn task_err(name: &str, error: ExternalError) -> TaskError {
    TaskError::External {
        env: name.to_string(),
        error,
    }
}

/// Starts the environment `name` (`params` go to the program's `hello`): one process says
/// hello, [`ExternalSpec::determinism_seeds`] seeds are played twice in fresh processes and
/// must agree. Environments already started in this process with the same pin and launch are
/// shared (the node builds its environment in several places).
pub fn start(
    name: &str,
    params: &serde_json::Value,
    spec: &ExternalSpec,
) -> Result<Arc<ExternalEnv>, TaskError> {
    type Started = Mutex<HashMap<(String, [u8; 32]), Arc<ExternalEnv>>>;
    static STARTED: OnceLock<Started> = OnceLock::new();
    let bad = |reason: String| TaskError::InvalidParams {
        task: name.to_string(),
        reason,
    };
    if let Some((k, p)) = spec.validate().into_iter().next() {
        return Err(bad(format!("external.{k}: {p}")));
    }
    let pin = pin(name, params, spec).map_err(|e| task_err(name, e))?;
    let key = (format!("{spec:?}"), pin);
    let started = STARTED.get_or_init(Default::default);
    // Held while starting: two threads building the same environment start it once.
    let mut map = started.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(env) = map.get(&key) {
        return Ok(env.clone());
    }
    // The sandbox wrapper would otherwise report a missing program as its own exit 127.
    if !program_exists(&spec.command[0]) {
        return Err(task_err(
            name,
            ExternalError::Spawn {
                program: spec.command[0].clone(),
                reason: "no such program (nor on PATH)".into(),
            },
        ));
    }
    let (launch, sandbox) = Launch::new(name, spec);
    let (first, hello) = open(&launch, name, params, spec).map_err(|e| task_err(name, e))?;
    let env = ExternalEnv {
        inner: Arc::new(Inner {
            name: name.to_string(),
            params: params.clone(),
            spec: spec.clone(),
            launch,
            hello,
            pin,
            idle: Mutex::new(vec![first]),
            counters: Counters::default(),
        }),
    };
    env.check_determinism().map_err(|e| task_err(name, e))?;
    tracing::info!(env = name, pin = %hex_pin(&pin), version = ?env.inner.hello.version,
        no_network = sandbox.no_network, memory_limit = sandbox.memory_limit,
        "external environment started");
    let env = Arc::new(env);
    map.insert(key, env.clone());
    Ok(env)
}

/// One scripted play of an episode: what the environment said at every turn.
#[derive(Debug, PartialEq)]
struct Transcript {
    turns: Vec<(String, u32, bool)>,
}

impl ExternalEnv {
    /// The pin (see [`pin`]).
    pub fn pin(&self) -> [u8; 32] {
        self.inner.pin
    }

    /// What the program said in its `hello`.
    pub fn hello(&self) -> &Hello {
        &self.inner.hello
    }

    /// Counters of processes and calls.
    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Plays `seed` in a fresh process: each turn the reference action (or the empty one).
    fn transcript(&self, seed: u64) -> Result<Transcript, ExternalError> {
        let inner = &self.inner;
        let mut p = inner.fresh()?;
        let mut turns = vec![(inner.reset(&mut p, seed)?, 0, false)];
        for turn in 0..inner.hello.max_turns.min(16) {
            let v = inner.call(
                &mut p,
                Op::Reference,
                &Request::Reference {
                    seed: u64::from(turn),
                },
            )?;
            let action = parse::<ReferenceReply>(Op::Reference, v)?
                .action
                .unwrap_or_default();
            let v = inner.call(&mut p, Op::Step, &Request::Step { action: &action })?;
            let s: StepReply = parse(Op::Step, v)?;
            let reward = check_reward(Op::Step, s.reward)?;
            turns.push((s.observation.unwrap_or_default(), reward.to_bits(), s.done));
            if s.done {
                break;
            }
        }
        Ok(Transcript { turns })
    }

    fn check_determinism(&self) -> Result<(), ExternalError> {
        let n = u64::from(self.inner.spec.determinism_seeds);
        let states = self.inner.hello.num_initial_states.unwrap_or(u64::MAX);
        let (mut checked, mut failed) = (0u64, None);
        for seed in 0..n.min(states) {
            let (a, b) = match (self.transcript(seed), self.transcript(seed)) {
                (Ok(a), Ok(b)) => (a, b),
                // Not started at all: nothing later would start either.
                (Err(e @ ExternalError::Spawn { .. }), _)
                | (_, Err(e @ ExternalError::Spawn { .. })) => return Err(e),
                // The same episode fails the same way twice (a program that crashes on some
                // seeds): not a sign of nondeterminism; such episodes are abandoned in play.
                (Err(e), Err(_)) => {
                    tracing::warn!(env = %self.inner.name, seed, error = %e,
                        "determinism check: the episode failed in both replays; seed skipped");
                    failed.get_or_insert(e);
                    continue;
                }
                (Ok(_), Err(e)) | (Err(e), Ok(_)) => {
                    return Err(ExternalError::NonDeterministic {
                        seed,
                        detail: format!("one replay ended, the other failed ({e})"),
                    })
                }
            };
            checked += 1;
            if a != b {
                let turn = a.turns.iter().zip(&b.turns).position(|(x, y)| x != y);
                return Err(ExternalError::NonDeterministic {
                    seed,
                    detail: match turn {
                        Some(0) => "the first observation".into(),
                        Some(t) => format!("the answer to action {t}"),
                        None => "the episode length".into(),
                    },
                });
            }
        }
        match failed {
            // No seed could be replayed: determinism is unknown, so the program is refused.
            Some(e) if checked == 0 => Err(e),
            _ => Ok(()),
        }
    }
}

/// An episode played by one process.
struct ExternalEpisode {
    env: Arc<Inner>,
    proc: Option<Proc>,
    seed: u64,
    ret: f32,
    turns: u32,
    done: bool,
}

impl ExternalEpisode {
    fn fail(&mut self, e: ExternalError) -> TaskError {
        self.proc = None;
        self.done = true;
        self.env.failed(&e);
        task_err(&self.env.name, e)
    }

    fn proc(&mut self) -> Result<&mut Proc, TaskError> {
        match self.proc.as_mut() {
            Some(p) => Ok(p),
            None => Err(task_err(
                &self.env.name,
                ExternalError::PastEnd {
                    detail: "the episode was over or abandoned".into(),
                },
            )),
        }
    }

    /// The episode ended with return `self.ret`: inside the range, or an error.
    fn end(&mut self) -> Result<(), TaskError> {
        self.done = true;
        let (lo, hi) = self.env.hello.return_range;
        // Partial sums may round: allow what f32 sums of in-range rewards can differ by.
        let slack = 1e-5 * (1.0 + lo.abs().max(hi.abs()));
        if !(self.ret >= lo - slack && self.ret <= hi + slack) {
            let ret = self.ret;
            return Err(self.fail(ExternalError::ReturnOutOfRange { ret, lo, hi }));
        }
        if let Some(p) = self.proc.take() {
            self.env.checkin(p);
        }
        Ok(())
    }
}

impl Drop for ExternalEpisode {
    fn drop(&mut self) {
        // A process that answered every call is healthy: the next `reset` starts over.
        if let Some(p) = self.proc.take() {
            self.env.checkin(p);
        }
    }
}

impl Episode for ExternalEpisode {
    /// The engine calls [`Episode::try_step`]; a failure here ends the episode with a NaN
    /// reward, which no check accepts.
    fn step(&mut self, action: &str) -> Step {
        self.try_step(action)
            .unwrap_or(Step::Done { reward: f32::NAN })
    }

    fn try_step(&mut self, action: &str) -> Result<Step, TaskError> {
        if self.done {
            return Err(task_err(
                &self.env.name,
                ExternalError::PastEnd {
                    detail: "a step after the end".into(),
                },
            ));
        }
        let env = self.env.clone();
        let p = self.proc()?;
        let reply = env.call(p, Op::Step, &Request::Step { action });
        let s = match reply.and_then(|v| parse::<StepReply>(Op::Step, v)) {
            Ok(s) => s,
            Err(e) => return Err(self.fail(e)),
        };
        let reward = match check_reward(Op::Step, s.reward) {
            Ok(r) => r,
            Err(e) => return Err(self.fail(e)),
        };
        self.ret += reward;
        self.turns += 1;
        if s.done {
            self.end()?;
            return Ok(Step::Done { reward });
        }
        let Some(observation) = s.observation else {
            return Err(self.fail(ExternalError::Protocol {
                op: "step",
                detail: "an episode that goes on needs an observation".into(),
            }));
        };
        // Past `max_turns` the engine truncates (its budget never exceeds the declared turns).
        Ok(Step::Continue {
            observation,
            reward,
        })
    }

    fn truncate(&mut self) -> f32 {
        self.try_truncate().unwrap_or(f32::NAN)
    }

    fn try_truncate(&mut self) -> Result<f32, TaskError> {
        let env = self.env.clone();
        let p = self.proc()?;
        let reply = env.call(p, Op::Truncate, &Request::Truncate);
        let r = match reply
            .and_then(|v| parse::<RewardReply>(Op::Truncate, v))
            .and_then(|r| check_reward(Op::Truncate, r.reward))
        {
            Ok(r) => r,
            Err(e) => return Err(self.fail(e)),
        };
        self.ret += r;
        self.end()?;
        Ok(r)
    }

    fn reference_action(&self, _: &mut dyn rand::RngCore) -> Option<String> {
        None
    }

    fn try_reference_action(
        &mut self,
        rng: &mut dyn rand::RngCore,
    ) -> Result<Option<String>, TaskError> {
        let seed = rng.next_u64() ^ self.seed;
        let env = self.env.clone();
        let p = self.proc()?;
        match env
            .call(p, Op::Reference, &Request::Reference { seed })
            .and_then(|v| parse::<ReferenceReply>(Op::Reference, v))
        {
            Ok(r) => Ok(r.action),
            Err(e) => Err(self.fail(e)),
        }
    }
}

impl Environment for ExternalEnv {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn metadata(&self) -> EnvMetadata {
        let h = &self.inner.hello;
        EnvMetadata {
            name: self.inner.name.clone(),
            description: h.description.clone(),
            num_initial_states: h.num_initial_states,
            max_turns: h.max_turns,
            return_range: h.return_range,
            suggested_tokens_per_turn: h.suggested_tokens_per_turn,
            max_observation_tokens: h
                .max_observation_tokens
                .unwrap_or(EnvMetadata::DEFAULT_OBSERVATION_TOKENS),
            params: self.inner.params.clone(),
        }
    }

    fn system_prompt(&self) -> Option<String> {
        self.inner.hello.system_prompt.clone()
    }

    fn reset(&self, seed: u64) -> Result<Start, TaskError> {
        let inner = &self.inner;
        if inner.hello.num_initial_states.is_some_and(|n| seed >= n) {
            return Err(TaskError::UnknownPrompt {
                task: inner.name.clone(),
                id: seed.to_string(),
            });
        }
        let mut p = inner.checkout().map_err(|e| {
            inner.failed(&e);
            task_err(&inner.name, e)
        })?;
        let observation = inner.reset(&mut p, seed).map_err(|e| {
            inner.failed(&e);
            task_err(&inner.name, e)
        })?;
        Ok(Start {
            prompt: Prompt {
                id: seed.to_string(),
                text: observation,
                answer: String::new(),
            },
            episode: Box::new(ExternalEpisode {
                env: inner.clone(),
                proc: Some(p),
                seed,
                ret: 0.0,
                turns: 0,
                done: false,
            }),
        })
    }

    fn pin(&self) -> Option<[u8; 32]> {
        Some(self.inner.pin)
    }
}

#[cfg(test)]
#[path = "external_tests.rs"]
mod tests;
