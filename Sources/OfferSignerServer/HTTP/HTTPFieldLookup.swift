import HTTPTypes

extension HTTPFields {
    /// The value of the field `name`, exactly as `self[name]` gives it (`nil` when absent;
    /// several fields of that name joined as HTTPTypes joins them), without building the joined
    /// string when the name occurs once, the usual case. `self[name]` always goes through a lazy
    /// map and `joined(separator:)`: about 4,000 instructions a lookup, three lookups on every
    /// signing request (Authorization, Content-Type, Content-Length).
    func value(of name: HTTPField.Name) -> String? {
        let canonicalName = name.canonicalName
        var found: Int?
        var index = startIndex
        while index < endIndex {
            if self[index].name.canonicalName == canonicalName {
                if found != nil { return self[name] }
                found = index
            }
            index += 1
        }
        guard let found else { return nil }
        return self[found].value
    }
}
