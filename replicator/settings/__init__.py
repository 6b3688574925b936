"""What the user says: one declaration per option (:mod:`.options`), the frozen Settings and their one
resolution path (:mod:`.config`), the options as typer flags (:mod:`.flags`), connection strings
(:mod:`.uri`), the selection and renames (:mod:`.selection`) and field rules (:mod:`.fields`). Pure."""
