//! The README and the guides in `docs/`, as doctests.

#[doc = include_str!("../README.md")]
pub struct Readme;

#[doc = include_str!("../docs/APP.md")]
pub struct App;

#[doc = include_str!("../docs/ARCHITECTURE.md")]
pub struct Architecture;

#[doc = include_str!("../docs/CONTRACT.md")]
pub struct Contract;

#[doc = include_str!("../docs/DEAD-LETTERS.md")]
pub struct DeadLetters;

#[doc = include_str!("../docs/PARKING.md")]
pub struct Parking;

#[doc = include_str!("../docs/PUBLISHING.md")]
pub struct Publishing;
