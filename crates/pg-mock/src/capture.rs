//! Stream capture's bookkeeping: which streams capture into which capture, the steps each capture recorded,
//! the events recorded inside a capture, and the checks CUDA makes (a forbidden call invalidates the capture; a
//! capture ends only when every stream that joined it has joined back).
//!
//! A leaf: it knows streams, events and buffers only by their numbers, and the recorded work only as closures
//! that re-issue it on a stream given by its index; `stream.rs` turns an ended capture into a [`crate::MockGraph`].
//! Its lock is taken before the world's state lock, never while holding it.

use std::any::Any;
use std::collections::{HashMap, HashSet};

use pg_core::{Error, Result};

/// Re-issues one captured operation on the stream with this global index.
pub(crate) type Replay = Box<dyn Fn(usize) -> Result<()> + Send + Sync>;

/// One recorded step, on the stream of its slot (slot 0: the origin stream).
pub(crate) enum Step {
    /// An operation (a kernel, a copy, a collective's part): a node of the graph.
    Op { name: String, run: Replay },
    /// An event recorded on the slot's stream (the capture's event number).
    Record(usize),
    /// The slot's stream waits on a capture event.
    Wait(usize),
}

/// A handle the graph keeps alive, with the memory block it holds.
pub(crate) struct Kept {
    pub(crate) block: u64,
    /// Held, never read: dropping it is what frees the memory.
    pub(crate) _alive: Box<dyn Any + Send + Sync>,
}

/// One capture in progress.
struct Capture {
    device: usize,
    /// The global index of each slot's stream; slot 0 is the origin.
    streams: Vec<usize>,
    steps: Vec<(usize, Step)>,
    /// Per graph node: the nodes it depends on.
    deps: Vec<Vec<usize>>,
    /// Per slot: the nodes its next operation depends on (CUDA's capture dependency set).
    tails: Vec<Vec<usize>>,
    /// Per capture event: the dependency set of its stream when it was recorded.
    events: Vec<Vec<usize>>,
    /// Why a forbidden call invalidated the capture.
    invalid: Option<String>,
    kept: Vec<Kept>,
}

/// What an ended capture hands to its graph.
pub(crate) struct Ended {
    pub(crate) device: usize,
    pub(crate) slots: usize,
    pub(crate) steps: Vec<(usize, Step)>,
    pub(crate) events: usize,
    pub(crate) nodes: usize,
    pub(crate) kept: Vec<Kept>,
}

/// Every capture of a world.
#[derive(Default)]
pub(crate) struct Captures {
    next: u64,
    /// Capturing streams (global index) and their capture.
    by_stream: HashMap<usize, u64>,
    active: HashMap<u64, Capture>,
    /// Events recorded inside a capture: event id to (capture, capture event number).
    events: HashMap<u64, (u64, usize)>,
}

impl Captures {
    /// The capture `stream` takes part in and its slot there.
    pub(crate) fn slot(&self, stream: usize) -> Option<(u64, usize)> {
        let id = *self.by_stream.get(&stream)?;
        let slot = self.active[&id].streams.iter().position(|s| *s == stream)?;
        Some((id, slot))
    }

    /// Whether `stream` is capturing.
    pub(crate) fn is_capturing(&self, stream: usize) -> bool {
        self.by_stream.contains_key(&stream)
    }

    /// A capturing stream of `device`, if any.
    pub(crate) fn capturing_on(&self, device: usize) -> Option<usize> {
        self.by_stream.keys().copied().filter(|s| self.active[&self.by_stream[s]].device == device).min()
    }

    /// Starts capturing `stream` of `device`.
    pub(crate) fn begin(&mut self, stream: usize, device: usize, label: &str) -> Result<()> {
        if self.by_stream.contains_key(&stream) {
            return Err(Error::capture(format!("begin_capture: {label} is already capturing")));
        }
        self.next += 1;
        let id = self.next;
        self.by_stream.insert(stream, id);
        let capture = Capture {
            device,
            streams: vec![stream],
            steps: Vec::new(),
            deps: Vec::new(),
            tails: vec![Vec::new()],
            events: Vec::new(),
            invalid: None,
            kept: Vec::new(),
        };
        self.active.insert(id, capture);
        Ok(())
    }

    /// Records an operation on the capturing `stream`; returns false (recording nothing) when it is not
    /// capturing.
    pub(crate) fn record_op(&mut self, stream: usize, name: &str, run: Replay) -> bool {
        let Some((id, slot)) = self.slot(stream) else { return false };
        let c = self.active.get_mut(&id).expect("active");
        let node = c.deps.len();
        c.deps.push(std::mem::replace(&mut c.tails[slot], vec![node]));
        c.steps.push((slot, Step::Op { name: name.to_owned(), run }));
        true
    }

    /// Records event `event` on the capturing `stream`; returns false when it is not capturing (a record outside
    /// any capture then forgets an earlier record of the event inside one).
    pub(crate) fn record_event(&mut self, stream: usize, event: u64) -> bool {
        let Some((id, slot)) = self.slot(stream) else {
            self.events.remove(&event);
            return false;
        };
        let c = self.active.get_mut(&id).expect("active");
        let number = c.events.len();
        c.events.push(c.tails[slot].clone());
        c.steps.push((slot, Step::Record(number)));
        self.events.insert(event, (id, number));
        true
    }

    /// Makes `stream` (of `device`) wait on event `event` if the event was recorded inside a capture: the stream
    /// joins that capture (CUDA's cross-stream capture). Returns false when neither the event nor the stream
    /// belongs to a capture (an ordinary wait). A capturing stream waiting on an event recorded outside its
    /// capture, or on one of another capture, is refused and invalidates its capture.
    pub(crate) fn wait_event(&mut self, stream: usize, device: usize, event: u64, label: &str) -> Result<bool> {
        let own = self.by_stream.get(&stream).copied();
        let Some(&(id, number)) = self.events.get(&event) else {
            return match own {
                None => Ok(false),
                Some(own) => Err(self.invalidate_capture(
                    own,
                    format!("wait_event: {label} is capturing and waits on an event recorded outside its capture"),
                )),
            };
        };
        if own.is_some_and(|own| own != id) {
            let own = own.expect("checked");
            return Err(self.invalidate_capture(
                own,
                format!("wait_event: {label} would merge two captures (the event was recorded in another one)"),
            ));
        }
        let c = self.active.get_mut(&id).expect("captured events belong to active captures");
        if own.is_none() && c.device != device {
            return Err(Error::invalid(format!("wait_event: {label} cannot join a capture of another device")));
        }
        let slot = match c.streams.iter().position(|s| *s == stream) {
            Some(slot) => slot,
            None => {
                c.streams.push(stream);
                c.tails.push(Vec::new());
                self.by_stream.insert(stream, id);
                c.streams.len() - 1
            }
        };
        let extra = c.events[number].clone();
        let tail = &mut c.tails[slot];
        for node in extra {
            if !tail.contains(&node) {
                tail.push(node);
            }
        }
        c.steps.push((slot, Step::Wait(number)));
        Ok(true)
    }

    /// Refuses `what` on `stream` when it is capturing, invalidating its capture (CUDA's
    /// `cudaErrorStreamCaptureUnsupported`).
    pub(crate) fn refuse_on_stream(&mut self, stream: usize, what: impl FnOnce() -> String) -> Result<()> {
        match self.by_stream.get(&stream).copied() {
            None => Ok(()),
            Some(id) => Err(self.invalidate_capture(id, what())),
        }
    }

    /// Refuses `what` on event `event` when it was recorded inside a capture still in progress.
    pub(crate) fn refuse_on_event(&mut self, event: u64, what: impl FnOnce() -> String) -> Result<()> {
        match self.events.get(&event).copied() {
            None => Ok(()),
            Some((id, _)) => Err(self.invalidate_capture(id, what())),
        }
    }

    fn invalidate_capture(&mut self, id: u64, why: String) -> Error {
        if let Some(c) = self.active.get_mut(&id) {
            c.invalid.get_or_insert_with(|| why.clone());
        }
        Error::capture(why)
    }

    /// Keeps `kept` alive with the graph of the capture `stream` takes part in.
    pub(crate) fn keep(&mut self, stream: usize, kept: Kept, label: &str) -> Result<()> {
        let Some(id) = self.by_stream.get(&stream) else {
            return Err(Error::invalid(format!("capture_keep_alive: {label} is not capturing")));
        };
        self.active.get_mut(id).expect("active").kept.push(kept);
        Ok(())
    }

    /// Ends the capture `stream` began. The capture ends (its streams stop capturing) even when it fails:
    /// invalidated, or with a joined stream whose work the origin stream does not wait for.
    pub(crate) fn end(&mut self, stream: usize, label: &str) -> Result<Ended> {
        let Some(&id) = self.by_stream.get(&stream) else {
            return Err(Error::capture(format!("end_capture: {label} is not capturing")));
        };
        if self.active[&id].streams[0] != stream {
            return Err(Error::capture(format!(
                "end_capture: {label} joined a capture that another stream began; end it on that stream"
            )));
        }
        let c = self.active.remove(&id).expect("active");
        self.by_stream.retain(|_, v| *v != id);
        self.events.retain(|_, (v, _)| *v != id);
        if let Some(why) = c.invalid {
            return Err(Error::capture(format!("end_capture: the capture on {label} was invalidated by: {why}")));
        }
        let mut joined = HashSet::new();
        let mut todo = c.tails[0].clone();
        while let Some(node) = todo.pop() {
            if joined.insert(node) {
                todo.extend(c.deps[node].iter().copied());
            }
        }
        let unjoined: Vec<String> = c
            .steps
            .iter()
            .filter_map(|(slot, step)| match step {
                Step::Op { name, .. } => Some((*slot, name)),
                _ => None,
            })
            .enumerate()
            .filter(|(node, _)| !joined.contains(node))
            .map(|(_, (slot, name))| format!("'{name}' on the stream of slot {slot}"))
            .collect();
        if !unjoined.is_empty() {
            return Err(Error::capture(format!(
                "end_capture: unjoined: {} captured on a stream that joined the capture of {label} and never joined \
                 back (the origin stream must wait on an event recorded on that stream after its work)",
                unjoined.join(", ")
            )));
        }
        Ok(Ended {
            device: c.device,
            slots: c.streams.len(),
            nodes: c.deps.len(),
            events: c.events.len(),
            steps: c.steps,
            kept: c.kept,
        })
    }
}

impl std::fmt::Debug for Captures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Captures").field("active", &self.active.len()).field("streams", &self.by_stream.len()).finish()
    }
}
