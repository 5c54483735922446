//! The pull requests a source has out, and what they still owe.
//!
//! Several requests may be out at once, so that the server always has one
//! to fill while the runtime keeps up: waiting for a request to be filled
//! before sending the next left the server idle for a round trip per
//! request. Together they never ask for more than the runtime's free
//! slots. nats-server fills waiting requests in turn (first in, first out
//! in 2.9, round robin in later versions), so which request a delivery
//! answers is not known, only that it pays one of what they owe in all.

use std::collections::VecDeque;

use async_nats::Subject;
use tokio::time::Instant;

/// A pull request the server may be filling.
#[derive(Debug)]
pub(super) struct PullRequest {
    pub(super) reply: Subject,
    /// The messages it asked for.
    pub(super) batch: usize,
    /// When it is given up if the server did not end it.
    pub(super) deadline: Instant,
    /// The connection it was sent on.
    pub(super) epoch: u64,
}

/// The requests out, oldest first, and the messages they still owe.
#[derive(Debug, Default)]
pub(super) struct Pulls {
    requests: VecDeque<PullRequest>,
    owed: usize,
}

impl Pulls {
    /// How many messages to ask for now, if a request is due, with `max`
    /// slots free of a budget of `budget`: the free slots beyond what is
    /// owed, at once when nothing is; otherwise once that gap is half the
    /// budget (a request per delivery would cost the server a request per
    /// message). With `single`, one request out at most.
    pub(super) fn due(&self, max: usize, budget: usize, single: bool) -> Option<usize> {
        let gap = max.saturating_sub(self.owed);
        if gap == 0 {
            return None;
        }
        if self.requests.is_empty() {
            return Some(gap);
        }
        if single {
            return None;
        }
        (gap >= (budget / 2).max(1)).then_some(gap)
    }

    /// Counts a request just sent.
    pub(super) fn sent(&mut self, request: PullRequest) {
        self.owed += request.batch;
        self.requests.push_back(request);
    }

    /// Counts a delivery: once nothing is owed, every request is filled.
    pub(super) fn delivered(&mut self) {
        self.owed = self.owed.saturating_sub(1);
        if self.owed == 0 {
            self.requests.clear();
        }
    }

    /// Ends the request whose reply subject is `reply` (the server ended
    /// it), `unfilled` of its messages not sent, if the server said;
    /// `false` if no request out has that subject.
    pub(super) fn ended(&mut self, reply: &str, unfilled: Option<usize>) -> bool {
        let Some(index) = self
            .requests
            .iter()
            .position(|request| request.reply.as_str() == reply)
        else {
            return false;
        };
        self.end(index, unfilled);
        true
    }

    /// Gives up requests sent on another connection than `epoch` (all of
    /// them then) and those past their deadline.
    pub(super) fn expire(&mut self, now: Instant, epoch: u64) {
        if self.requests.iter().any(|request| request.epoch != epoch) {
            self.forget();
        }
        while let Some(index) = self
            .requests
            .iter()
            .position(|request| request.deadline <= now)
        {
            self.end(index, None);
        }
    }

    /// Gives up every request.
    pub(super) fn forget(&mut self) {
        self.requests.clear();
        self.owed = 0;
    }

    /// The earliest deadline of the requests out.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.requests.iter().map(|request| request.deadline).min()
    }

    /// Takes a request's unfilled rest off what is owed, and what is owed
    /// down to what the requests left asked for. Without a count nothing
    /// is taken off but that: the count owed must never fall below what
    /// the server may still send, or the next request would ask beyond the
    /// free slots (a count too high costs at most a smaller request, until
    /// the last request out ends).
    fn end(&mut self, index: usize, unfilled: Option<usize>) {
        let Some(request) = self.requests.remove(index) else {
            return;
        };
        let unfilled = unfilled.unwrap_or(0).min(request.batch);
        let left: usize = self.requests.iter().map(|request| request.batch).sum();
        self.owed = self.owed.saturating_sub(unfilled).min(left);
    }

    #[cfg(test)]
    fn owed(&self) -> usize {
        self.owed
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn request(number: u64, batch: usize, deadline: Instant, epoch: u64) -> PullRequest {
        PullRequest {
            reply: Subject::from(format!("_INBOX.x.{number}")),
            batch,
            deadline,
            epoch,
        }
    }

    #[test]
    fn a_request_tops_up_once_half_the_budget_is_free_beyond_what_is_owed() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut pulls = Pulls::default();
        assert_eq!(pulls.due(1000, 1000, false), Some(1000), "nothing owed");
        pulls.sent(request(1, 1000, deadline, 0));
        for _ in 0..499 {
            pulls.delivered();
        }
        assert_eq!(pulls.due(1000, 1000, false), None, "a gap of 499");
        pulls.delivered();
        assert_eq!(pulls.due(1000, 1000, false), Some(500));
        assert_eq!(pulls.due(1000, 1000, true), None, "one at a time");
        assert_eq!(pulls.due(400, 1000, false), None, "slots taken");
        pulls.sent(request(2, 500, deadline, 0));
        for _ in 0..1000 {
            pulls.delivered();
        }
        assert_eq!(pulls.owed(), 0);
        assert_eq!(pulls.deadline(), None, "every request filled");
    }

    #[test]
    fn a_request_the_server_ended_pays_its_unfilled_rest() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut pulls = Pulls::default();
        pulls.sent(request(1, 100, deadline, 0));
        pulls.sent(request(2, 50, deadline, 0));
        for _ in 0..30 {
            pulls.delivered();
        }
        // A 408 with `Nats-Pending-Messages: 80`.
        assert!(pulls.ended("_INBOX.x.1", Some(80)));
        assert_eq!(pulls.owed(), 40);
        assert!(!pulls.ended("_INBOX.x.1", Some(80)), "ended already");
        // No count: at most what the one left asked for, and nothing once
        // none is left.
        pulls.sent(request(3, 30, deadline, 0));
        assert!(pulls.ended("_INBOX.x.2", None));
        assert_eq!(pulls.owed(), 30);
        assert!(pulls.ended("_INBOX.x.3", None));
        assert_eq!(pulls.owed(), 0);
    }

    #[test]
    fn requests_of_an_older_connection_or_past_their_deadline_are_given_up() {
        let now = Instant::now();
        let mut pulls = Pulls::default();
        pulls.sent(request(1, 10, now, 0));
        pulls.sent(request(2, 10, now + Duration::from_secs(5), 0));
        pulls.expire(now, 0);
        assert_eq!(pulls.owed(), 10, "the one left");
        assert_eq!(pulls.deadline(), Some(now + Duration::from_secs(5)));
        pulls.expire(now, 1);
        assert_eq!(pulls.owed(), 0);
        assert_eq!(pulls.deadline(), None);
    }

    /// What happens between the source and the server.
    #[derive(Clone, Debug)]
    enum Event {
        /// The runtime asks with this many slots free of 100.
        Ask(usize),
        /// The server sends a message for one of the requests it fills.
        Deliver(prop::sample::Index),
        /// The server ends one of them, saying how much it left unfilled
        /// or not.
        End(prop::sample::Index, bool),
    }

    proptest! {
        /// What the source counts as owed never falls below what the
        /// server may still send, so that a request never makes the server
        /// owe more than the free slots of the moment.
        #[test]
        fn what_is_asked_never_passes_the_free_slots(
            events in proptest::collection::vec(
                prop_oneof![
                    1 => (0..=100usize).prop_map(Event::Ask),
                    3 => any::<prop::sample::Index>().prop_map(Event::Deliver),
                    1 => (any::<prop::sample::Index>(), any::<bool>())
                        .prop_map(|(index, counted)| Event::End(index, counted)),
                ],
                1..200,
            )
        ) {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut pulls = Pulls::default();
            // What the server still owes, request by request.
            let mut server: Vec<(u64, usize)> = Vec::new();
            let mut number = 0;
            for event in events {
                match event {
                    Event::Ask(max) => {
                        if let Some(batch) = pulls.due(max, 100, false) {
                            number += 1;
                            pulls.sent(request(number, batch, deadline, 0));
                            server.push((number, batch));
                            let owed: usize = server.iter().map(|(_, left)| left).sum();
                            prop_assert!(owed <= max, "the server owes {} of {} free", owed, max);
                        }
                    }
                    Event::Deliver(index) if !server.is_empty() => {
                        let at = index.index(server.len());
                        server[at].1 -= 1;
                        if server[at].1 == 0 {
                            server.remove(at);
                        }
                        pulls.delivered();
                    }
                    Event::End(index, counted) if !server.is_empty() => {
                        let (number, left) = server.remove(index.index(server.len()));
                        pulls.ended(&format!("_INBOX.x.{number}"), counted.then_some(left));
                    }
                    _ => {}
                }
                let owed: usize = server.iter().map(|(_, left)| left).sum();
                prop_assert!(pulls.owed() >= owed, "counted {} < {} owed", pulls.owed(), owed);
                if server.is_empty() && pulls.requests.is_empty() {
                    prop_assert_eq!(pulls.owed(), 0);
                }
            }
        }
    }
}
