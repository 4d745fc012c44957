//! `rbd:POOL/IMAGE[,conf=PATH][,id=NAME][,cluster=NAME]`: an RBD image in a
//! Ceph cluster.

use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub image: String,
    /// The cluster's configuration file; librados's own search
    /// (/etc/ceph/$cluster.conf, ~/.ceph/...) when absent.
    pub conf: Option<PathBuf>,
    /// The client id: `admin` means the user `client.admin`.
    pub id: String,
    pub cluster: String,
    /// The spec as written, for logs and the pool registry.
    pub text: String,
}

impl RbdSpec {
    /// Parses what follows `rbd:`.
    pub fn parse(body: &str) -> Result<RbdSpec, String> {
        let mut parts = body.split(',');
        let name = parts.next().unwrap_or_default();
        let (pool, image) = name
            .split_once('/')
            .filter(|(pool, image)| !pool.is_empty() && !image.is_empty())
            .ok_or_else(|| {
                format!("rbd:{body}: want rbd:POOL/IMAGE[,conf=PATH][,id=NAME][,cluster=NAME]")
            })?;
        let mut spec = RbdSpec {
            pool: pool.into(),
            image: image.into(),
            conf: None,
            id: "admin".into(),
            cluster: "ceph".into(),
            text: format!("rbd:{body}"),
        };
        for option in parts {
            match option.split_once('=') {
                Some(("conf", path)) if !path.is_empty() => spec.conf = Some(path.into()),
                Some(("id", id)) if !id.is_empty() => spec.id = id.into(),
                Some(("cluster", cluster)) if !cluster.is_empty() => {
                    spec.cluster = cluster.into()
                }
                _ => {
                    return Err(format!(
                        "rbd:{body}: unknown option {option:?} (known: conf=PATH, id=NAME, cluster=NAME)"
                    ))
                }
            }
        }
        if [&spec.pool, &spec.image, &spec.id, &spec.cluster]
            .iter()
            .any(|text| text.contains('\0'))
        {
            return Err(format!("rbd:{body}: names cannot hold NUL"));
        }
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let spec = RbdSpec::parse("rbd/disk1").unwrap();
        assert_eq!((spec.pool.as_str(), spec.image.as_str()), ("rbd", "disk1"));
        assert_eq!((spec.id.as_str(), spec.cluster.as_str()), ("admin", "ceph"));
        assert_eq!(spec.conf, None);
        assert_eq!(spec.text, "rbd:rbd/disk1");

        let spec = RbdSpec::parse("vms/a/b,conf=/etc/c.conf,id=weir,cluster=east").unwrap();
        assert_eq!((spec.pool.as_str(), spec.image.as_str()), ("vms", "a/b"));
        assert_eq!(spec.conf, Some(PathBuf::from("/etc/c.conf")));
        assert_eq!((spec.id.as_str(), spec.cluster.as_str()), ("weir", "east"));

        for bad in [
            "",
            "rbd",
            "/img",
            "rbd/",
            "rbd/x,conf=",
            "rbd/x,size=1G",
            "rbd/x,id",
        ] {
            assert!(RbdSpec::parse(bad).is_err(), "{bad:?} parsed");
        }
    }
}
