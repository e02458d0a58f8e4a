//! The operator command inbox: how an override (seed 002's manual mode)
//! reaches the loop that can carry it out.
//!
//! A pin is for the engine of the partition that carries the channel (the
//! request loop); a freeze is for the group's writer (the group loop). Each
//! loop drains its inbox between two steps of its own, so a command never
//! races the loop's state. A command is carried out where it applies on this
//! instance and ignored elsewhere: the pin's OVERRIDE alert comes from the
//! partition that applied it, the freeze's from the writer.

use crate::state::Pin;
use std::sync::mpsc;
use tokio::sync::mpsc as async_mpsc;

/// One operator command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Pins a channel (`Some`: drain or hold a weight, with an optional
    /// expiry in event time), or clears its pin (`None`).
    Pin { channel: String, pin: Option<Pin> },
    /// Freezes (`on`) or unfreezes a group's weights (manual mode).
    Freeze { group: String, on: bool },
}

/// The sending side of both loops' inboxes.
#[derive(Clone)]
pub struct Commands {
    requests: mpsc::Sender<Command>,
    groups: async_mpsc::UnboundedSender<Command>,
}

/// The receiving sides, one per loop.
pub struct Inboxes {
    pub requests: mpsc::Receiver<Command>,
    pub groups: async_mpsc::UnboundedReceiver<Command>,
}

impl Commands {
    pub fn new() -> (Commands, Inboxes) {
        let (requests, requests_rx) = mpsc::channel();
        let (groups, groups_rx) = async_mpsc::unbounded_channel();
        let inboxes = Inboxes {
            requests: requests_rx,
            groups: groups_rx,
        };
        (Commands { requests, groups }, inboxes)
    }

    /// Queues `cmd` for the loop that carries it out. False if that loop
    /// has stopped.
    pub fn send(&self, cmd: Command) -> bool {
        match cmd {
            Command::Pin { .. } => self.requests.send(cmd).is_ok(),
            Command::Freeze { .. } => self.groups.send(cmd).is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::PinKind;

    #[test]
    fn each_command_reaches_the_loop_that_carries_it_out() {
        let (commands, mut inboxes) = Commands::new();
        let pin = Command::Pin {
            channel: "free-a".into(),
            pin: Some(Pin {
                kind: PinKind::Drain,
                until_ms: None,
            }),
        };
        let freeze = Command::Freeze {
            group: "chat".into(),
            on: true,
        };
        assert!(commands.send(pin.clone()));
        assert!(commands.send(freeze.clone()));
        assert_eq!(inboxes.requests.try_recv().ok(), Some(pin));
        assert!(inboxes.requests.try_recv().is_err());
        assert_eq!(inboxes.groups.try_recv().ok(), Some(freeze));
        drop(inboxes);
        assert!(!commands.send(Command::Freeze {
            group: "chat".into(),
            on: false
        }));
    }
}
