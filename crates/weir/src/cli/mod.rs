//! Subcommands that administer pools, volumes and scrubs, offline or
//! through a running server's admin endpoint.

pub mod pool;

/// A clap parser for a closed set of names, so that the policies and modes
/// of the sans-IO cores it yields need not know about clap.
pub fn one_of<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
) -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(all.iter().map(|v| name(*v))).map(move |text| {
        *all.iter()
            .find(|v| name(**v) == text)
            .expect("clap accepted only these names")
    })
}
