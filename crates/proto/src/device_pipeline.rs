//! A device's whole pipeline: its functions in front of the log ([`Fronts`]), the ordering of
//! keyed writes and cache reads ([`KeyedOrdering`]), then the log ([`Device`]). It puts the
//! device, the functions and the ordering together, so none of them depends on another here.

use crate::{
    CountDrop, Device, DropCounts, FrontFunction, Fronts, KeyedOrdering, NetworkFunction, Pipeline,
    Stack,
};

/// The pipeline of a device: its functions in front of the log ([`Fronts`]), then the log
/// ([`Device`]), which forwards requests to their servers.
pub type DevicePipeline = Pipeline<Stack<Fronts, Device>>;

impl DevicePipeline {
    /// A pipeline of `fronts`, in order, and then the log `device`, with the ordering of keyed
    /// writes and cache reads ([`KeyedOrdering`], rebuilt from what the log holds)
    /// just in front of it.
    pub fn with_fronts(mut fronts: Vec<Box<dyn FrontFunction>>, device: Device) -> Self {
        fronts.push(Box::new(KeyedOrdering::new(
            &device.config().servers,
            device.logged_packets(),
        )));
        Pipeline::new(Stack::new(Fronts::new(fronts), device))
    }

    /// A pipeline of one function, `front`, and then `device`.
    pub fn with_front(front: Box<dyn FrontFunction>, device: Device) -> DevicePipeline {
        DevicePipeline::with_fronts(vec![front], device)
    }

    /// The counters of the functions in front of the log (see
    /// [`NetworkFunction::counter_samples`]).
    pub fn front_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.functions.front.counter_samples()
    }

    /// The counter `name` of the functions in front of the log, if one of them has it.
    pub fn front_sample(&self, name: &str) -> Option<u64> {
        self.front_samples()
            .into_iter()
            .find(|(sample, _, _)| *sample == name)
            .map(|(_, _, value)| value)
    }

    /// The log function.
    pub fn device(&self) -> &Device {
        &self.functions.back
    }

    pub fn device_mut(&mut self) -> &mut Device {
        &mut self.functions.back
    }

    /// Every datagram the device dropped, by reason: the pipeline's own drops (unparseable,
    /// no function for the type), the front functions' and the log's.
    pub fn dropped(&self) -> DropCounts {
        self.drops.clone().merged(&self.functions.dropped())
    }

    /// The reports of the functions in front of the log (see [`NetworkFunction::report`]).
    pub fn front_report(&self) -> Option<String> {
        self.functions.front.report()
    }

    /// The functions in front of the log.
    pub fn fronts(&self) -> &Fronts {
        &self.functions.front
    }
}
